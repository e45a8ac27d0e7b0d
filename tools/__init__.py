"""Tools around the product: benchmarks, the soak, the load generator, the Celery
baselines, the demo and the sample inputs. The product never imports them; their `tandem`
subcommands plug in through the `tandem.commands` entry points."""
