"""Publishing to the Hugging Face Hub: export, push, Hub reachability."""
