"""The bench's scenarios, one module per family: each measures and returns a JSON-ready dict for results.json.

stream (P1/P2: streaming throughput, client CPU per token), startup (P3: attach, cold start), multiturn (P4: prefix
cache), batch (P5: abatch), header (P6: GGUF header), speculative (P7/P8), cache_type (P9: KV cache type).
"""
