"""Memory and placement: the context fit, the devices a server can use, RPC workers, and the plan that splits a
model between GPUs and RAM."""
