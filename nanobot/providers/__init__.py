"""Model providers: the OpenAI-compatible client, and a replay of recorded turns for offline demos."""
