"""What every training job shares, whatever the family or the task: the trainer (model, optimizer, mesh,
sharded state, AOT-compiled steps), the loop (log, eval, checkpoint, stop), optimizers and schedules,
checkpoints, metrics and event files, sharding, batch warmup, the memory check and the TPU compile report.
Nothing here names a family or a task: the model comes from models/, the task's sums from the job."""
