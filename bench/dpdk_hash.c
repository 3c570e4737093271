/*
 * DPDK's rte_hash (cuckoo, 8 slots a bucket, 16-bit signatures) on the flow table's workload:
 * 1 M IPv4/IPv6-sized flow keys (40 bytes, the flowlane key's size) in 2^20 slots (95 % full:
 * rte_hash rounds its entries up to a power of two, so 2^20 is the nearest to 90 %), lookups
 * half hits and half misses, shuffled; inserts of 1 M keys into an empty table. Prints lookups per
 * second for rte_hash_lookup (one at a time) and rte_hash_lookup_bulk (FLOWLANE_BULK at a time,
 * default 32), and
 * inserts per second, median of rounds. The peer measurement for
 * `cargo bench -p flowlane-flowtable`. Build and run: bench/dpdk_hash.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rte_common.h>
#include <rte_eal.h>
#include <rte_hash.h>
#include <rte_jhash.h>
#include <rte_hash_crc.h>
#include <rte_version.h>

#define FLOWS 1000000u
#define QUERIES (1u << 20)
#define ROUNDS 9
/* The flowlane key's 40 bytes (one table for both families, as flowlane's is), or with
 * FLOWLANE_KEY=16 its first 16 — all an IPv4 flow needs, as DPDK's l3fwd keys an IPv4
 * 5-tuple (13 bytes padded to 16): rte_hash at its best on this IPv4 workload. */
#define KEY_LEN (getenv("FLOWLANE_KEY") && atoi(getenv("FLOWLANE_KEY")) == 16 ? 16 : 40)
/* Slots: rte_hash rounds its entries up to a power of two; 2^20 holds 1 M flows 95 % full
 * (FLOWLANE_DPDK_ENTRIES overrides, e.g. 1111111 for a table that rounds to 2^21, 48 %). */
#define ENTRIES (getenv("FLOWLANE_DPDK_ENTRIES") ? (uint32_t)atol(getenv("FLOWLANE_DPDK_ENTRIES")) : (1u << 20))

struct key {
	uint32_t w[10];
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The same random-looking flows as the Rust benchmark's key(i), in the same words as
 * flowlane's FlowKey::v4: ports, protocol, source, destination, then zeros. */
static void make_key(uint64_t i, struct key *k)
{
	uint64_t x = i * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	memset(k, 0, sizeof *k);
	k->w[0] = ((uint32_t)(uint16_t)(x >> 16) << 16) | (uint16_t)(x | 1);
	k->w[1] = 17u << 24;
	k->w[2] = (uint32_t)(x >> 32);
	k->w[3] = (uint32_t)x;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Keys a bulk lookup is given: FLOWLANE_BULK (default 32; at most 64, rte_hash's
 * RTE_HASH_LOOKUP_BULK_MAX), as the Rust benchmark gives its get_batch. */
static uint32_t bulk_size(void)
{
	const char *v = getenv("FLOWLANE_BULK");
	uint32_t n = v ? (uint32_t)atoi(v) : 32;
	return n >= 1 && n <= RTE_HASH_LOOKUP_BULK_MAX && QUERIES % n == 0 ? n : 0;
}

/* One round of every query, bulk_size() at a time: M lookups a second; hits added to *found. */
static double bulk_round(const struct rte_hash *h, const void **qptr, int32_t *pos,
			 uint64_t *found)
{
	uint32_t n = bulk_size();
	double t0 = now();
	for (uint32_t q = 0; q + n <= QUERIES; q += n) {
		rte_hash_lookup_bulk(h, &qptr[q], n, pos);
		for (uint32_t j = 0; j < n; j++)
			*found += pos[j] >= 0;
	}
	return QUERIES / (now() - t0) / 1e6;
}

int main(int argc, char **argv)
{
	/* On hugepages, as DPDK is deployed and as flowlane's table runs (transparent huge pages
	 * through its allocator); FLOWLANE_DPDK_NO_HUGE=1 runs on ordinary pages instead. */
	int no_huge = getenv("FLOWLANE_DPDK_NO_HUGE") != NULL;
	char *huge_eal[] = { argv[0], "--in-memory", "--no-pci", "-l", "0", "--log-level", "0", NULL };
	char *plain_eal[] = { argv[0], "--no-huge", "-m", "2048", "--no-pci", "-l", "0",
			      "--log-level", "0", NULL };
	char **eal = no_huge ? plain_eal : huge_eal;
	int eal_args = no_huge ? 9 : 7;
	/* `lookups N`: one table, N rounds of bulk lookups only, one line `bulk M/s` (the median).
	 * `turns`: one table, then a line `ready`, and a round of bulk lookups for each line read
	 * on stdin, each answered by a line of M/s — so bench/flowtable_vs_dpdk.sh can alternate
	 * rte_hash's rounds with the Rust benchmark's in the same seconds, round by round. */
	int turns = argc == 2 && strcmp(argv[1], "turns") == 0;
	int lookups_only = turns || (argc == 3 && strcmp(argv[1], "lookups") == 0);
	int rounds = turns ? 1 : lookups_only ? atoi(argv[2]) : ROUNDS;
	if (argc != 1 && (!lookups_only || rounds < 1 || rounds > ROUNDS)) {
		fprintf(stderr, "usage: %s [lookups ROUNDS (1-%d) | turns]\n", argv[0], ROUNDS);
		return 2;
	}
	if (bulk_size() == 0) {
		fprintf(stderr, "FLOWLANE_BULK must be a power of two from 1 to %d\n",
			RTE_HASH_LOOKUP_BULK_MAX);
		return 2;
	}
	if (rte_eal_init(eal_args, eal) < 0) {
		fprintf(stderr, "rte_eal_init failed\n");
		return 1;
	}
	struct rte_hash_parameters p = {
		.name = "flows",
		.entries = ENTRIES,
		.key_len = KEY_LEN,
		.hash_func = rte_hash_crc,
		.hash_func_init_val = 0,
		.socket_id = 0,
	};
	struct key *keys = malloc(sizeof(struct key) * FLOWS);
	struct key *queries = malloc(sizeof(struct key) * QUERIES);
	const void **qptr = malloc(sizeof(void *) * QUERIES);
	int32_t *pos = malloc(sizeof(int32_t) * RTE_HASH_LOOKUP_BULK_MAX);
	double bulk[ROUNDS], single[ROUNDS], ins[ROUNDS];
	for (uint32_t i = 0; i < FLOWS; i++)
		make_key(i, &keys[i]);
	for (uint64_t q = 0; q < QUERIES; q++) {
		uint64_t r = (q * 0x2545F4914F6CDD1Dull) >> 11;
		make_key(q % 2 == 0 ? r % FLOWS : FLOWS + r, &queries[q]);
		qptr[q] = &queries[q];
	}
	struct rte_hash *h = NULL;
	for (int round = 0; round < (lookups_only ? 1 : ROUNDS); round++) {
		if (h)
			rte_hash_free(h);
		h = rte_hash_create(&p);
		if (!h) {
			fprintf(stderr, "rte_hash_create failed\n");
			return 1;
		}
		double t0 = now();
		for (uint32_t i = 0; i < FLOWS; i++)
			if (rte_hash_add_key(h, &keys[i]) < 0) {
				fprintf(stderr, "add failed at %u\n", i);
				return 1;
			}
		ins[round] = FLOWS / (now() - t0) / 1e6;
	}
	uint64_t found = 0;
	if (turns) {
		char line[16];
		printf("ready\n");
		fflush(stdout);
		while (fgets(line, sizeof line, stdin)) {
			found = 0;
			double m = bulk_round(h, qptr, pos, &found);
			if (found != QUERIES / 2) {
				fprintf(stderr, "found %llu of %u queries, expected half\n",
					(unsigned long long)found, QUERIES);
				return 1;
			}
			printf("%.3f\n", m);
			fflush(stdout);
		}
		return 0;
	}
	if (lookups_only) {
		for (int round = 0; round < rounds; round++)
			bulk[round] = bulk_round(h, qptr, pos, &found);
		qsort(bulk, rounds, sizeof(double), cmp_double);
		if (found != (uint64_t)rounds * QUERIES / 2) {
			fprintf(stderr, "found %llu of %u queries, expected half\n",
				(unsigned long long)found, rounds * QUERIES);
			return 1;
		}
		printf("bulk %.2f\n", bulk[rounds / 2]);
		return 0;
	}
	for (int round = 0; round < ROUNDS; round++) {
		bulk[round] = bulk_round(h, qptr, pos, &found);
		double t0 = now();
		for (uint32_t q = 0; q < QUERIES; q++)
			found += rte_hash_lookup(h, &queries[q]) >= 0;
		single[round] = QUERIES / (now() - t0) / 1e6;
	}
	qsort(bulk, ROUNDS, sizeof(double), cmp_double);
	qsort(single, ROUNDS, sizeof(double), cmp_double);
	qsort(ins, ROUNDS, sizeof(double), cmp_double);
	printf("%s rte_hash (crc32, 8-slot buckets, %d-byte keys), 1 M flows in %u slots "
	       "(%.0f %% full), 50 %% misses:\n",
	       rte_version(), KEY_LEN, rte_align32pow2(ENTRIES),
	       100.0 * FLOWS / rte_align32pow2(ENTRIES));
	printf("  lookup_bulk(%u) %.1f M/s, lookup %.1f M/s (medians of %d); inserts %.1f M/s; "
	       "hits %.3f of queries\n",
	       bulk_size(), bulk[ROUNDS / 2], single[ROUNDS / 2], ROUNDS, ins[ROUNDS / 2],
	       (double)found / (2.0 * ROUNDS * QUERIES));
	return 0;
}
