"""What runs a job's attempt: the Executor protocol, in-process and on Ray, spot notices, and the embedded `gpuplan
run`."""
