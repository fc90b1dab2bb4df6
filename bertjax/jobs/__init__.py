"""One library per command, named as the command: `python -m bertjax.X` (bertjax/X.py: its flags) runs
`bertjax.jobs.X`. A job reads the config and the user's paths, refuses what cannot work before any work
starts, then runs on the libraries of the role folders (training/, models/, finetuning/, data/); it raises
ValueError or OSError in one sentence for a user's mistake, which cli.run_job turns into the command's one
line. stage.py is the main job's corpus → vocab → records step, run on the tokenizer and prepare jobs."""
