"""Learned draft heads (EAGLE-3): the head module (``head.py``), its on-disk formats (``format.py``),
the training data drawn from the target itself (``data.py``) and the training command (``train.py``).
The drafter that runs a head in the verification loops is ``drafters/eagle.py``."""
