"""Fine-tuning's own pieces: the task registry (tasks/: one module a task kind), readers of labelled files
(readers.py, squad.py, glue_data.py, pydocs_task.py), rows in memory and packed (arrays.py,
example_packing.py), the heads' trainer.Task (heads.py) and held-out scores (scores.py). The fine-tuning,
GLUE and predict jobs are in jobs/."""
