/* A storage node's lone APPEND after the TLS read and before the TLS write, in one C call
 * (issue 33's sketch, docs/sketches/lone_append/README.md). Not the product.
 *
 * payload: an APPEND_REQUEST frame's payload (after the 7-byte frame header): type, sessionId,
 * seqNum, partitionId, the record count, then one wire record (txid, reqId, header, dataLength,
 * data, dataChecksum) and the usedByOfflineRecovery byte.
 * state: seg_fd, idx_fd, first_txid, next_txid, next_offset (int64 each), moved on success.
 * answer: 28 bytes, the SUCCESS_RESPONSE frame.
 * Returns the answer's length, -1 for a request this path does not take (the general path's),
 * or -errno of a failed write or sync. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#define APPEND_REQUEST_TYPE 6
#define SUCCESS_RESPONSE_TYPE 7
#define STORAGE_MAGIC 'S'
#define RECORDS_START 25   /* type 1 + sessionId 8 + seqNum 8 + partitionId 4 + count 4 */
#define WIRE_PREFIX 32     /* txid 8 + reqId 16 + header 4 + dataLength 4: the same on disk */
#define SEGMENT_HEADER 128 /* both files' header */
#define INDEX_ENTRY 8
#define CHECKPOINT_INTERVAL 1000 /* the original fsyncs both files at each 1000th txid */
#define ANSWER_BYTES 28

enum { SEG_FD, IDX_FD, FIRST_TXID, NEXT_TXID, NEXT_OFFSET };

static uint64_t get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

static uint32_t get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static void put64(uint8_t *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

static void put32(uint8_t *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

long lone_append(const uint8_t *payload, int size, int64_t *state, uint8_t *answer) {
    if (size < RECORDS_START + WIRE_PREFIX + 4 + 1 || payload[0] != APPEND_REQUEST_TYPE)
        return -1;
    int32_t count = (int32_t)get32(payload + 21);
    const uint8_t *rec = payload + RECORDS_START;
    int64_t txid = (int64_t)get64(rec);
    int32_t length = (int32_t)get32(rec + 28);
    if (count != 1 || length < 0 || RECORDS_START + WIRE_PREFIX + (long)length + 4 + 1 != size ||
        txid != state[NEXT_TXID])
        return -1;
    /* The disk layout: the 32 shared bytes, the data checksum, the data, the CRC32 of those. */
    const uint8_t *data = rec + WIRE_PREFIX;
    const uint8_t *checksum = data + length;
    uLong crc = crc32(0L, rec, WIRE_PREFIX);
    crc = crc32(crc, checksum, 4);
    crc = crc32(crc, data, (uInt)length);
    uint8_t crc_bytes[4];
    put32(crc_bytes, (uint32_t)crc);
    struct iovec parts[4] = {
        {(void *)rec, WIRE_PREFIX}, {(void *)checksum, 4}, {(void *)data, (size_t)length}, {crc_bytes, 4}};
    ssize_t record_bytes = WIRE_PREFIX + 4 + length + 4;
    int64_t offset = state[NEXT_OFFSET];
    ssize_t written = pwritev((int)state[SEG_FD], parts, 4, offset);
    if (written != record_bytes)
        return written < 0 ? -errno : -EIO; /* (the product finishes a short write; not here) */
    uint8_t entry[INDEX_ENTRY];
    put64(entry, (uint64_t)offset);
    off_t index_at = SEGMENT_HEADER + INDEX_ENTRY * (txid - state[FIRST_TXID]);
    written = pwrite((int)state[IDX_FD], entry, INDEX_ENTRY, index_at);
    if (written != INDEX_ENTRY)
        return written < 0 ? -errno : -EIO;
    int64_t next = txid + 1;
    if (next % CHECKPOINT_INTERVAL == 0) {
        if (fsync((int)state[IDX_FD]) != 0 || fsync((int)state[SEG_FD]) != 0)
            return -errno;
    } else if (fdatasync((int)state[SEG_FD]) != 0) {
        return -errno;
    }
    state[NEXT_TXID] = next;
    state[NEXT_OFFSET] = offset + record_bytes;
    /* SUCCESS_RESPONSE: magic, version, length; type, sessionId, seqNum, partitionId. */
    answer[0] = STORAGE_MAGIC;
    answer[1] = 0;
    answer[2] = 0;
    put32(answer + 3, ANSWER_BYTES - 7);
    answer[7] = SUCCESS_RESPONSE_TYPE;
    memcpy(answer + 8, payload + 1, 20); /* the request's header, as it came */
    return ANSWER_BYTES;
}
