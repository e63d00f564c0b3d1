"""SSE lines of one real llama-server stream (SmolLM2-135M, "Say hi", max_tokens 12, include_usage), as
``httpx.Response.iter_lines`` yielded them, captured verbatim from this project's server build. The tool-call and
error lines are shaped like llama-server's (field notes, section 3): SmolLM2 has no tool template.
"""

SMOLLM2_STREAM = [
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1795331810,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"I"}}],"created":1795331810,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"\'m"}}],"created":1795331815,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" glad"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" you"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"\'re"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" enjoying"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" the"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" chat"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"!"}}],"created":1795331817,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" What"}}],"created":1795331818,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" brings"}}],"created":1795331820,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" you"}}],"created":1795331820,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1795331820,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}',
    '',
    'data: {"choices":[],"created":1795331820,"id":"chatcmpl-Ch2UBCUuFxj6uqapJxkpSy4o9WX0Lwk9","model":"gguf-provider-d2b520f216d2d960","system_fingerprint":"b0-unknown","object":"chat.completion.chunk","usage":{"completion_tokens":12,"prompt_tokens":32,"total_tokens":44,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"cache_n":0,"prompt_n":32,"prompt_ms":2644.084,"prompt_per_token_ms":82.627625,"prompt_per_second":12.102489936023213,"predicted_n":12,"predicted_ms":9515.857,"predicted_per_token_ms":865.0779090909091,"predicted_per_second":1.1559652483218275}}',
    '',
    'data: [DONE]',
    '',
]

TOOL_CALL_STREAM = [
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"object":"chat.completion.chunk"}',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"add","arguments":"{\\"a\\": 1"}}]}}],"object":"chat.completion.chunk"}',
    'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":", \\"b\\": 2}"}}]}}],"object":"chat.completion.chunk"}',
    'data: {"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"model":"m","timings":{"prompt_n":5,"predicted_n":9,"predicted_per_second":40.5,"cache_n":0},"object":"chat.completion.chunk"}',
    'data: [DONE]',
]

ERROR_LINES = [
    'error: {"code":500,"message":"slot unavailable","type":"server_error"}',
    'data: {"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":3000,"n_ctx":2048}}',
]
