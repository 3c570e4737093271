/*
 * DPDK's Toeplitz hashes on the tuples `cargo bench -p flowlane-rss --bench toeplitz` hashes:
 * the peer measurement behind issue 29's single-hash targets. 1024 distinct tuples per pass
 * (IPv4 4-tuples 198.18.x.y:p -> 198.19.0.1:8080, 12 bytes; IPv6 likewise, 36 bytes), the
 * Microsoft key, each tuple's bytes in network order as a NIC reads them. Rows: rte_thash_gfni
 * one tuple at a time (AVX-512 + GFNI; the fastest single hash DPDK has), rte_thash_gfni_bulk
 * over the pass, and rte_softrss (DPDK's scalar hash). Prints ns/hash per row, the best and the
 * median of the rounds, after checking every path against the Microsoft verification rows.
 * Build and run: bench/dpdk_thash.sh (needs libdpdk-dev and a CPU with AVX-512 and GFNI).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rte_thash.h>

#ifndef RTE_THASH_GFNI_DEFINED
#error "rte_thash_gfni needs a compiler targeting AVX-512 and GFNI (-march=native on such a CPU)"
#endif

#define N 1024
#define ROUNDS 15
#define PASSES 2000

static const uint8_t key[40] = {
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
	0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
	0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v & 0xff;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, v >> 16);
	put16(p + 2, v & 0xffff);
}

/* The bench's tuples (flowlane-rss benches/toeplitz.rs `tuples`), as bytes in network order. */
static void tuples(int len, uint8_t *out)
{
	for (uint32_t i = 0; i < N; i++) {
		uint32_t x = i * 2654435761u;
		uint8_t *t = out + (size_t)i * len;
		memset(t, 0, len);
		if (len == 12) {
			put32(t, 0xc6120000u | (x & 0xffff));
			put32(t + 4, 0xc6130001u);
			put16(t + 8, x >> 16);
			put16(t + 10, 8080);
		} else {
			t[0] = 0x20, t[1] = 0x01, t[2] = 0x00, t[3] = 0x02;
			put32(t + 12, x);
			t[16] = 0x20, t[17] = 0x01, t[18] = 0x00, t[19] = 0x02;
			put32(t + 28, 0x00010001u);
			put16(t + 32, x >> 16);
			put16(t + 34, 8080);
		}
	}
}

/* The same input as host-order words, as rte_softrss takes it. */
static void words(const uint8_t *t, int len, uint32_t *w)
{
	for (int k = 0; k < len / 4; k++)
		w[k] = (uint32_t)t[4 * k] << 24 | (uint32_t)t[4 * k + 1] << 16 |
		       (uint32_t)t[4 * k + 2] << 8 | t[4 * k + 3];
}

static int check(const uint64_t *m)
{
	/* Microsoft's verification rows: 66.9.149.187:2794 -> 161.142.100.80:1766 and
	 * 199.92.111.2:14230 -> 65.69.140.83:4739, 4-tuple and addresses only. */
	static const struct {
		uint32_t s, d;
		uint16_t sp, dp;
		uint32_t h4, h2;
	} rows[] = {
		{ 0x420995bb, 0xa18e6450, 2794, 1766, 0x51ccc178, 0x323e8fc2 },
		{ 0xc75c6f02, 0x41458c53, 14230, 4739, 0xc626b0ea, 0xd718262a },
	};
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		uint8_t t[12];
		uint32_t w[3];
		put32(t, rows[r].s);
		put32(t + 4, rows[r].d);
		put16(t + 8, rows[r].sp);
		put16(t + 10, rows[r].dp);
		words(t, 12, w);
		uint32_t g4 = rte_thash_gfni(m, t, 12), g2 = rte_thash_gfni(m, t, 8);
		uint32_t s4 = rte_softrss(w, 3, key), s2 = rte_softrss(w, 2, key);
		if (g4 != rows[r].h4 || g2 != rows[r].h2 || s4 != rows[r].h4 || s2 != rows[r].h2) {
			fprintf(stderr, "row %zu: gfni %08x/%08x softrss %08x/%08x, want %08x/%08x\n",
				r, g4, g2, s4, s2, rows[r].h4, rows[r].h2);
			return 1;
		}
	}
	return 0;
}

enum path { SINGLE, BULK, SOFT };

/* One round of `path` over the tuples: ns per hash; folds the hashes into `acc`. */
static double round_ns(enum path path, const uint64_t *m, int len, const uint8_t *ts,
		       uint8_t **ptrs, const uint32_t *ws, uint32_t *acc)
{
	uint32_t out[N];
	uint32_t a = 0;
	int passes = path == SOFT ? PASSES / 10 : PASSES;
	double t0 = now();
	for (int p = 0; p < passes; p++) {
		switch (path) {
		case SINGLE:
			for (int i = 0; i < N; i++)
				a ^= rte_thash_gfni(m, ts + (size_t)i * len, len);
			break;
		case BULK:
			rte_thash_gfni_bulk(m, len, ptrs, out, N);
			a ^= out[p % N];
			break;
		case SOFT:
			for (int i = 0; i < N; i++)
				a ^= rte_softrss((uint32_t *)(ws + (size_t)i * (len / 4)), len / 4, key);
			break;
		}
		__asm__ volatile("" : : "r"(a) : "memory");
	}
	double t = now() - t0;
	*acc ^= a;
	return t * 1e9 / ((double)passes * N);
}

int main(void)
{
	uint64_t m[40];
	rte_thash_complete_matrix(m, key, sizeof key);
	if (check(m))
		return 1;
	static const char *names[] = { "rte_thash_gfni single", "rte_thash_gfni_bulk",
				       "rte_softrss single" };
	uint32_t acc = 0;
	printf("DPDK %s Toeplitz, %d distinct tuples a pass, %d rounds: ns/hash best / median\n",
	       "22.11", N, ROUNDS);
	for (int len = 12; len <= 36; len += 24) {
		uint8_t *ts = malloc((size_t)N * len);
		uint32_t *ws = malloc((size_t)N * len);
		uint8_t *ptrs[N];
		if (!ts || !ws)
			return 1;
		tuples(len, ts);
		for (int i = 0; i < N; i++) {
			ptrs[i] = ts + (size_t)i * len;
			words(ptrs[i], len, ws + (size_t)i * (len / 4));
		}
		for (int p = SINGLE; p <= SOFT; p++) {
			double r[ROUNDS];
			for (int k = 0; k < ROUNDS; k++)
				r[k] = round_ns(p, m, len, ts, ptrs, ws, &acc);
			qsort(r, ROUNDS, sizeof r[0], cmp_double);
			printf("%3dB  %-24s %8.3f %8.3f\n", len, names[p], r[0], r[ROUNDS / 2]);
		}
		free(ts);
		free(ws);
	}
	printf("(fold %08x)\n", acc);
	return 0;
}
