"""Example run specs, shipped in the wheel as `offloadlab.examples`: `offloadlab init DIR` writes them out."""
