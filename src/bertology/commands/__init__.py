"""Commands: what every command does around its work, written once (:mod:`bertology.commands.base`), and the one
place that keeps run folders written by earlier versions resuming (:mod:`bertology.commands.compat`)."""
