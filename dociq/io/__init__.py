"""Files dociq reads and writes: checkpoints (one loader), mask codecs, progress of long loops."""
