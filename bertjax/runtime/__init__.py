"""The process around a job: the allocator (tcmalloc), TensorFlow imported without Keras, one job per workdir
(lock.py), and which directories are bertjax's to write (ownership.py: another tool's files are refused before
any work starts)."""
