"""The operators' library behind the ``waltz`` command (the original's ``waltz-tools``, reference §4).

Every command is a function here a Python user can call too: cluster checks and repairs
(``cluster_ops``: ClusterCli, ServerCli, recover, truncate), the local dev cluster
(``devcluster``), reading and writing partitions from the shell (``client_tools``: ClientCli),
offline storage inspection (``inspect``: DiskCli), ``top``, the ``retention show`` report
(``retention_report``), and where a command finds the cluster (``tool_config``).
"""
