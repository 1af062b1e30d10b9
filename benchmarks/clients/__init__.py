"""Small scripts that drive one peer client each; every one runs as a process of its own."""
