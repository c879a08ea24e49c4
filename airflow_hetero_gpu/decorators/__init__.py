"""TaskFlow decorators of the provider: ``@task.hetero_train`` (see docs/operator.md)."""
