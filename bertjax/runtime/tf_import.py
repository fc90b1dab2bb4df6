"""TensorFlow without the Keras it imports eagerly: bertjax's processes use tf.data and tf.io only.

`import tensorflow` (2.21) ends by importing Keras 3 and, through it, scikit-learn, "so that registration of
optimizers in the SavedModel registry happens at load time": measured on the 2-core AMD EPYC, 1.4 s of its
3.4 s, paid by every job process and every test process. `skip_keras_while_tensorflow_imports()` makes
Keras unloadable only while TensorFlow's own `__init__` runs, which catches that ImportError and goes on;
TensorFlow's lazy `tf.keras` still finds Keras's directory, and `tf.keras` or `import keras` afterwards load it
as usual. The command-line entry points (`cli.run`) and the test suite install it; importing bertjax as a
library changes nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Optional


class _Refused(importlib.abc.Loader):
    def create_module(self, spec: Any) -> None:
        raise ImportError("Keras is not loaded while TensorFlow imports (bertjax.runtime.tf_import)")

    def exec_module(self, module: Any) -> None:  # pragma: no cover  (create_module refuses first)
        raise ImportError("Keras is not loaded while TensorFlow imports (bertjax.runtime.tf_import)")


class _KerasAfterTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if name != "keras" and not name.startswith("keras."):
            return None
        tf = sys.modules.get("tensorflow")
        if tf is None or not getattr(getattr(tf, "__spec__", None), "_initializing", False):
            return None  # not inside TensorFlow's import: the usual finders load Keras
        real = importlib.machinery.PathFinder.find_spec(name, path)
        if real is None:
            return None
        # The real origin (TensorFlow reads Keras's directory from it for the lazy tf.keras), but no loading.
        return importlib.machinery.ModuleSpec(
            name, _Refused(), origin=real.origin, is_package=real.submodule_search_locations is not None
        )


def skip_keras_while_tensorflow_imports() -> None:
    """Installs the finder once; a no-op when TensorFlow is imported already."""
    if "tensorflow" in sys.modules or any(isinstance(f, _KerasAfterTensorFlow) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _KerasAfterTensorFlow())


def quiet_tensorflow_start() -> None:
    """No oneDNN banner: TensorFlow's C++ start-up logs "oneDNN custom operations are on" (and, logging before absl
    is set up, "All log messages before absl::InitializeLog() ...") twice per process, whatever
    TF_CPP_MIN_LOG_LEVEL says. bertjax runs tf.data and tf.io only, whose kernels oneDNN does not change, so its
    commands turn the option off unless TF_ENABLE_ONEDNN_OPTS is set; set before TensorFlow is imported."""
    import os

    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
