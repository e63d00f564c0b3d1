"""Serving: the llama-server option table, a server's config and command line, the registry shared between
processes, the memory budget, health, failure diagnosis, metrics, the prompt cache, the watchdog, the status view
and the manager that acquires, shares and releases servers."""
