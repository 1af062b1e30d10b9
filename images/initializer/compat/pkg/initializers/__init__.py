"""`python -m pkg.initializers.{dataset,model}`, as the Kubeflow SDK's local backend runs them."""
