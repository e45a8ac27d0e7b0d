"""tandem's executors, running inside ordinary Celery worker processes."""
