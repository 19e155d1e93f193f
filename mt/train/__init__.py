"""Training a model: the loop (loop), the run's state (state) and what resuming it needs (resume), Adam and its
schedule (optim), when to stop (stopping), log.jsonl and the progress bar (log), validation (validate), ensemble
runs (members), what `--init` starts from (finetune), torchrun (distributed) and checkpoint averaging (average).
Imports mt.data, mt.model and mt.decode (validation translates), never mt.serve or mt.export.
"""
