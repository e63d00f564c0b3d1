"""Common parts of the runtime: paths, processes, progress and cancellation, the GGUF reader, the host probe, the
threads our servers share, and the model and spec fields every config is made of."""
