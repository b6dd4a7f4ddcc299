"""Who may do what on a shared cluster: principals from TLS, ACLs in ZooKeeper, the audit log."""
