"""Subcommands of `truthlens`; each exposes add_arguments(parser) and run(args) -> int. Keep module-level imports light."""
