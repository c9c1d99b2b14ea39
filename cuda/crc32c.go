package cuda

// CRC32C (Castagnoli) arithmetic for the GPU checksum kernel
// (kernels/crc32c.cu): the kernel checksums each 4 KiB block of a range
// on its own, and the host joins the block checksums into the checksum of
// the whole range, so that the result equals hash/crc32's Castagnoli
// checksum of the same bytes without the bytes ever reaching host memory.
//
// Joining rests on the linearity of CRCs: for the standard (pre- and
// post-inverted) CRC, crc(A||B) = shift(crc(A), len(B)) ^ crc(B), where
// shift(x, n) multiplies x by x^(8n) modulo the polynomial, that is, feeds
// n zero bytes through the CRC register. shift is a linear map of 32-bit
// words over GF(2): a 32x32 bit matrix, kept as its 32 columns (the images
// of the single bits), and applied a byte at a time through four tables.

// CRCBlockSize is the span each GPU thread checksums on its own.
const CRCBlockSize = 4096

// castagnoliReflected is the CRC32C polynomial, bit-reversed as the
// reflected (least significant bit first) algorithm uses it.
const castagnoliReflected = 0x82f63b78

// gf2Matrix is a linear map of 32-bit words: column i is the image of 1<<i.
type gf2Matrix [32]uint32

func (m *gf2Matrix) apply(x uint32) uint32 {
	var y uint32
	for i := 0; x != 0; i, x = i+1, x>>1 {
		if x&1 != 0 {
			y ^= m[i]
		}
	}
	return y
}

// times returns m∘n (n first, then m).
func (m *gf2Matrix) times(n *gf2Matrix) gf2Matrix {
	var p gf2Matrix
	for i := range p {
		p[i] = m.apply(n[i])
	}
	return p
}

// zeroBitOperator feeds one zero bit through the reflected CRC register:
// the register shifts right, and a 1 falling off the end folds in the
// polynomial.
func zeroBitOperator() gf2Matrix {
	var m gf2Matrix
	m[0] = castagnoliReflected
	for i := 1; i < 32; i++ {
		m[i] = 1 << (i - 1)
	}
	return m
}

// zeroBytesOperator is shift by n zero bytes, by repeated squaring of the
// one-byte operator.
func zeroBytesOperator(n int64) gf2Matrix {
	var result gf2Matrix
	for i := range result {
		result[i] = 1 << i // identity
	}
	bit := zeroBitOperator()
	op := bit
	for i := 1; i < 8; i++ {
		op = op.times(&bit) // one byte: eight zero bits
	}
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			result = result.times(&op)
		}
		op = op.times(&op)
	}
	return result
}

// byteTables spread a matrix over the four bytes of its argument, so that
// applying it takes four lookups.
type byteTables [4][256]uint32

func tablesOf(m *gf2Matrix) *byteTables {
	var t byteTables
	for k := 0; k < 4; k++ {
		for v := 0; v < 256; v++ {
			t[k][v] = m.apply(uint32(v) << (8 * k))
		}
	}
	return &t
}

func (t *byteTables) apply(x uint32) uint32 {
	return t[0][x&0xff] ^ t[1][(x>>8)&0xff] ^ t[2][(x>>16)&0xff] ^ t[3][x>>24]
}

// shiftBlock is shift by one whole block, the one the joining needs for
// every block but a short last one.
var shiftBlock = func() *byteTables {
	m := zeroBytesOperator(CRCBlockSize)
	return tablesOf(&m)
}()

// CombineCRC32C returns the CRC32C of a||b from crcA = CRC32C(a), crcB =
// CRC32C(b) and len(b).
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 {
	if lenB == CRCBlockSize {
		return shiftBlock.apply(crcA) ^ crcB
	}
	m := zeroBytesOperator(lenB)
	return m.apply(crcA) ^ crcB
}

// JoinBlockCRCs returns the CRC32C of n bytes from the CRC32Cs of their
// consecutive CRCBlockSize blocks (the last one holding the rest).
func JoinBlockCRCs(blocks []uint32, n int64) uint32 {
	if len(blocks) == 0 {
		return 0 // the CRC32C of nothing
	}
	crc := blocks[0]
	for i := 1; i < len(blocks); i++ {
		crc = CombineCRC32C(crc, blocks[i], min(CRCBlockSize, n-int64(i)*CRCBlockSize))
	}
	return crc
}
