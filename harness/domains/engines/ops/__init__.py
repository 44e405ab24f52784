"""The op catalogue and how one op runs under autocast: what the autocast policy table, the
compiled policy and the speed thresholds all call."""
