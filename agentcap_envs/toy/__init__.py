"""The offline toy worlds of the built-in tasks: ``movie`` (READ) and ``soundscapes`` (AudioMap, ACE-Cap)."""
