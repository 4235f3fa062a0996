"""The engine: requests, scheduler, KV pool, sampler, and the offline ``LLM`` facade."""
