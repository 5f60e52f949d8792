"""The composition root's builders: one per subsystem, each returning its parts complete (every
callback given at construction), and ``context.build_context``, which calls them in start-up
order and hands the parts to a frozen ``dgxmm.context.Context``."""
