"""Read-only views of the storage formats on disk (reference §1.4): the control file, segment
file headers, records and index, as a storage node wrote them, damage included. Used by
``waltz inspect`` and the Spark reader; never writes, never locks (the writing engine is
``waltz_engine.storage``).
"""
