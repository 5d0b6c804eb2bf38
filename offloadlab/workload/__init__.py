"""The workload every strategy trains: the GPT (or a Hugging Face model) and its token batches. Imports
torch and the spec only.
May import: spec."""
