"""tandem's Redis side: key layout, atomic scripts, executor table, coordinator."""
