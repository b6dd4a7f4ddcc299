"""ZooKeeper: the embedded server and byte-compatible cluster metadata (reference §2.2, §4.1).

Modules: ``server`` (embedded ZooKeeper), ``connection`` (settings + bounded kazoo client),
``java_io`` (DataOutputStream, writeUTF, String.hashCode, HashMap order), ``payloads`` (znode
codecs), ``paths`` (znode layout), ``znodes`` (typed reads/CAS writes), ``admin_lock``,
``cluster`` (create/delete/list), ``store_metadata`` (storage nodes, assignments, partition
metadata), ``znode_dump`` (every znode decoded), ``partition_ranges`` ("0-6,7,10-16"), and
our extensions the original's nodes ignore: ``retention`` (retention bounds and what the
cleaner may remove) and ``export_watermarks`` (what each export has durably taken).
"""
