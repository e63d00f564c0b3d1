"""Installing llama-server: what is installed, finding a binary (never installing one), the backend that fits
this machine, the release archive and the source build."""
