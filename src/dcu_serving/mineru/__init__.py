"""MinerU's API as dcu_mineru runs it (launcher.py): MinerU's own FastAPI app, with an upload limit."""
