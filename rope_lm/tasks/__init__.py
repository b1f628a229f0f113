"""Task text, torch-free: synthetic tasks (synthetic/) and the retrieval battery's tasks."""
