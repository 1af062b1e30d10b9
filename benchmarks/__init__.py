"""Side-by-side benchmark of the initializers against s5cmd, the AWS CLI, boto3, huggingface_hub,
the Kubeflow and KServe initializers, on local nginx-backed S3 and Hub endpoints.

Run with ``make bench`` or ``.bench/venv/bin/python -m benchmarks --help``.
"""
