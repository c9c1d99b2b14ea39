// The GPU half of stasis's CRC32C (Castagnoli) checksums of GPU memory:
// each thread checksums one 4096-byte block of a range (the last block may
// be shorter) with the standard CRC32C (initial value and final value
// inverted, as hash/crc32 and the stasis format use it), and the host
// joins the block checksums (cuda/crc32c.go). The cuFile path needs it:
// there the bytes go from GPU memory to the disk, or back, without passing
// through host memory, and every chunk must still be checksummed.
//
// crc32c.ptx beside this file is generated from it (cuda/kernels/Makefile,
// on a machine with nvcc) and embedded in stasis; the stand-in driver
// (cuda/testdata/fakecuda/libcuda.c) implements the same kernel on the
// host for tests without a GPU.

#define BLOCK_BYTES 4096
#define POLY 0x82f63b78u // CRC32C, reflected

// Slice-by-8 tables: table[0] is the classic byte table; table[k][v] is
// the CRC register after byte v followed by k zero bytes.
__device__ static void build_tables(unsigned int table[8][256]) {
	for (unsigned int v = threadIdx.x; v < 256; v += blockDim.x) {
		unsigned int c = v;
		for (int bit = 0; bit < 8; bit++) c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
		table[0][v] = c;
	}
	__syncthreads();
	for (int k = 1; k < 8; k++) {
		for (unsigned int v = threadIdx.x; v < 256; v += blockDim.x) {
			unsigned int c = table[k - 1][v];
			table[k][v] = (c >> 8) ^ table[0][c & 0xffu];
		}
		__syncthreads();
	}
}

// stasis_crc32c_blocks writes to out[i] the CRC32C of bytes
// [i*4096, min((i+1)*4096, n)) of src. Eight bytes at a time where src is
// 8-byte aligned, one at a time otherwise and for the tail.
extern "C" __global__ void stasis_crc32c_blocks(const unsigned char *src, unsigned long long n, unsigned int *out) {
	__shared__ unsigned int table[8][256];
	build_tables(table);

	unsigned long long block = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
	unsigned long long start = block * BLOCK_BYTES;
	if (start >= n) return;
	unsigned long long len = n - start < BLOCK_BYTES ? n - start : BLOCK_BYTES;
	const unsigned char *p = src + start;
	unsigned int crc = 0xffffffffu;
	unsigned long long i = 0;
	if (((unsigned long long)p & 7u) == 0) {
		const unsigned long long *words = (const unsigned long long *)p;
		for (; i + 8 <= len; i += 8) {
			unsigned long long w = words[i / 8];
			unsigned int lo = (unsigned int)w ^ crc, hi = (unsigned int)(w >> 32);
			crc = table[7][lo & 0xffu] ^ table[6][(lo >> 8) & 0xffu] ^ table[5][(lo >> 16) & 0xffu] ^ table[4][lo >> 24] ^
			      table[3][hi & 0xffu] ^ table[2][(hi >> 8) & 0xffu] ^ table[1][(hi >> 16) & 0xffu] ^ table[0][hi >> 24];
		}
	}
	for (; i < len; i++) crc = (crc >> 8) ^ table[0][(crc ^ p[i]) & 0xffu];
	out[block] = ~crc;
}
