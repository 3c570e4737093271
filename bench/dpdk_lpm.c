/*
 * DPDK's own rte_lpm (DIR-24-8) on a `flowlane route gen` table, traffic inside routed
 * prefixes and a repeated working set of 1024 of them (as `flowlane route bench` makes its
 * modes): the peer measurement behind the DIR-24-8 column of `flowlane route bench`.
 * Prints lookups per second for rte_lpm_lookup_bulk and rte_lpm_lookupx4 (SSE), median of
 * rounds. Build and run: bench/dpdk_lpm.sh TABLE (needs libdpdk-dev; no hugepages needed, but
 * FLOWLANE_DPDK_HUGE=1 puts the tables on them).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rte_eal.h>
#include <rte_lpm.h>
#include <rte_version.h>

#define N_ADDR (1u << 22)
#define ROUNDS 15
#define WORKING_SET 1024u

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Rounds of lookup_bulk and lookupx4 over `addr`: M lookups/s per round in `bulk` and `x4`,
 * sorted (the median is in the middle); returns results folded so none is optimised away. */
static uint64_t measure(struct rte_lpm *lpm, const uint32_t *addr, uint32_t *out,
			double bulk[ROUNDS], double x4[ROUNDS])
{
	uint64_t sum = 0;
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = now();
		for (uint32_t i = 0; i < N_ADDR; i += 64)
			rte_lpm_lookup_bulk(lpm, addr + i, out + i, 64);
		bulk[r] = N_ADDR / (now() - t0) / 1e6;
		sum += out[r];
		t0 = now();
		for (uint32_t i = 0; i < N_ADDR; i += 4) {
			xmm_t ip = _mm_loadu_si128((const __m128i *)(addr + i));
			rte_lpm_lookupx4(lpm, ip, out + i, UINT32_MAX);
		}
		x4[r] = N_ADDR / (now() - t0) / 1e6;
		sum += out[r];
	}
	qsort(bulk, ROUNDS, sizeof(double), cmp_double);
	qsort(x4, ROUNDS, sizeof(double), cmp_double);
	return sum;
}

int main(int argc, char **argv)
{
	/* Hugepages, as DPDK runs in production, when FLOWLANE_DPDK_HUGE is set (reserve them
	 * first: echo 700 > /proc/sys/vm/nr_hugepages); else ordinary pages, as flowlane uses. */
	const char *huge = getenv("FLOWLANE_DPDK_HUGE");
	char *eal[] = {argv[0], huge && *huge ? "--in-memory" : "--no-huge", "--no-pci",
		       "--no-shconf", "-m", "1024", "-l", "0", "--log-level=error"};
	if (argc < 2) {
		fprintf(stderr, "usage: %s TABLE (PREFIX/LEN NEXTHOP lines, IPv4)\n", argv[0]);
		return 2;
	}
	if (rte_eal_init(sizeof(eal) / sizeof(eal[0]), eal) < 0) {
		fprintf(stderr, "rte_eal_init failed\n");
		return 1;
	}
	FILE *f = fopen(argv[1], "r");
	if (!f) {
		perror(argv[1]);
		return 1;
	}
	uint32_t cap = 1u << 21, n = 0;
	uint32_t *pfx = malloc(cap * 4), *hop = malloc(cap * 4);
	uint8_t *len = malloc(cap);
	if (!pfx || !hop || !len) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	char line[256];
	unsigned long lineno = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned a, b, c, d, l, h;
		lineno++;
		if (sscanf(line, "%u.%u.%u.%u/%u %u", &a, &b, &c, &d, &l, &h) != 6)
			continue; /* IPv6 lines and comments */
		if (a > 255 || b > 255 || c > 255 || d > 255 || l > 32 || h >= 1u << 24) {
			fprintf(stderr, "%s:%lu: not an IPv4 route with a 24-bit next hop: %s",
				argv[1], lineno, line);
			return 2;
		}
		if (n == cap) {
			fprintf(stderr, "%s: more than %u IPv4 routes\n", argv[1], cap);
			return 2;
		}
		pfx[n] = a << 24 | b << 16 | c << 8 | d;
		len[n] = (uint8_t)l;
		hop[n] = h;
		n++;
	}
	fclose(f);
	if (n == 0) {
		fprintf(stderr, "%s: no IPv4 routes (PREFIX/LEN NEXTHOP lines)\n", argv[1]);
		return 2;
	}
	struct rte_lpm_config cfg = {.max_rules = n + 16, .number_tbl8s = 1u << 17, .flags = 0};
	struct rte_lpm *lpm = rte_lpm_create("flowlane", 0, &cfg);
	if (!lpm) {
		fprintf(stderr, "rte_lpm_create failed\n");
		return 1;
	}
	double t0 = now();
	for (uint32_t i = 0; i < n; i++) {
		if (rte_lpm_add(lpm, pfx[i], len[i], hop[i]) < 0) {
			fprintf(stderr, "rte_lpm_add failed at route %u\n", i);
			return 1;
		}
	}
	double build = now() - t0;
	uint32_t *addr = malloc(N_ADDR * 4), *out = malloc(N_ADDR * 4);
	if (!addr || !out) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	for (uint32_t i = 0; i < N_ADDR; i++) {
		uint32_t r = next32() % n;
		uint32_t host = len[r] == 32 ? 0 : (next32() & (0xFFFFFFFFu >> len[r]));
		addr[i] = pfx[r] | host;
	}
	double bulk[ROUNDS], x4[ROUNDS];
	uint64_t sum = 0;
	sum += measure(lpm, addr, out, bulk, x4);
	printf("rte_lpm (DPDK %s, %s): %u IPv4 routes added in %.0f ms; inside routed prefixes, "
	       "%u addresses: lookup_bulk %.1f M/s, lookupx4 %.1f M/s (medians of %d rounds) [%llu]\n",
	       rte_version(), huge && *huge ? "hugepages" : "no hugepages", n, build * 1e3, N_ADDR, bulk[ROUNDS / 2], x4[ROUNDS / 2], ROUNDS,
	       (unsigned long long)(sum & 1));
	/* The repeated working set of `flowlane route bench`: the first 1024 of those addresses,
	 * cycled in order (cache-resident tables). */
	for (uint32_t i = WORKING_SET; i < N_ADDR; i++)
		addr[i] = addr[i % WORKING_SET];
	sum += measure(lpm, addr, out, bulk, x4);
	printf("rte_lpm: repeated working set (%u addresses): lookup_bulk %.1f M/s, lookupx4 %.1f M/s "
	       "(medians of %d rounds) [%llu]\n",
	       WORKING_SET, bulk[ROUNDS / 2], x4[ROUNDS / 2], ROUNDS, (unsigned long long)(sum & 1));
	rte_lpm_free(lpm);
	rte_eal_cleanup();
	return 0;
}
