"""tandem's HTTP front door (`tandem http`): the Open Inference Protocol v2 and
OpenAI-style embeddings, for services that do not speak Celery. A producer like any
other: every request is routed by the same atomic rule. Needs the [http] extra."""
