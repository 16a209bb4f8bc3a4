"""The log's vocabulary: the facts a run's log keeps in `run_facts` (`facts.py`), typed, behind one codec.

Pure: no I/O and no import from the rest of `service`, so the store (which writes the rows), the run loop and
the commands (which build and read the facts) all depend on it and it on none of them.
"""
