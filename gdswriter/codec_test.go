package gdswriter

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// codecTestRand returns a deterministic generator for seed.
func codecTestRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

func codecTestRandom(n int, seed uint64) []byte {
	r := codecTestRand(seed)
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// codecTestText returns log-like text: a small vocabulary with numbers.
func codecTestText(n int, seed uint64) []byte {
	r := codecTestRand(seed)
	words := []string{"step", "loss", "grad_norm", "lr", "rank", "epoch", "tokens/s", "checkpoint", "saved", "shard"}
	var sb strings.Builder
	for sb.Len() < n {
		fmt.Fprintf(&sb, "%s=%d %s=%.4f\n", words[r.IntN(len(words))], r.IntN(100000), words[r.IntN(len(words))], r.Float64())
	}
	return []byte(sb.String()[:n])
}

// codecTestBF16Bits converts f to bf16 with round-to-nearest-even.
func codecTestBF16Bits(f float32) uint16 {
	u := math.Float32bits(f)
	return uint16((u + 0x7FFF + (u>>16)&1) >> 16)
}

// codecTestBF16 returns n bytes of little-endian bf16 values drawn from
// normal(0, sigma); an odd n ends with half a value.
func codecTestBF16(n int, seed uint64, sigma float64) []byte {
	r := codecTestRand(seed)
	b := make([]byte, n+1)
	for i := 0; i+1 < len(b); i += 2 {
		binary.LittleEndian.PutUint16(b[i:], codecTestBF16Bits(float32(r.NormFloat64()*sigma)))
	}
	return b[:n]
}

// codecTestFP32 returns n bytes of little-endian fp32 values drawn from
// normal(0, sigma).
func codecTestFP32(n int, seed uint64, sigma float64) []byte {
	r := codecTestRand(seed)
	b := make([]byte, n+3)
	for i := 0; i+3 < len(b); i += 4 {
		binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(r.NormFloat64()*sigma)))
	}
	return b[:n]
}

// codecTestMixed is bf16 data with every other 64 KiB zeroed.
func codecTestMixed(n int, seed uint64) []byte {
	b := codecTestBF16(n, seed, 0.02)
	for off := 0; off < n; off += 128 << 10 {
		clear(b[off:min(n, off+64<<10)])
	}
	return b
}

var codecTestKinds = []struct {
	name string
	gen  func(n int, seed uint64) []byte
}{
	{"random", codecTestRandom},
	{"zeros", func(n int, _ uint64) []byte { return make([]byte, n) }},
	{"text", codecTestText},
	{"bf16", func(n int, seed uint64) []byte { return codecTestBF16(n, seed, 0.02) }},
	{"fp32", func(n int, seed uint64) []byte { return codecTestFP32(n, seed, 1) }},
	{"mixed", codecTestMixed},
}

var codecTestMethods = []Method{MethodNone, MethodZstd, MethodS2, MethodAuto}

// codecTestRoundTrip encodes raw, checks the invariants of Encode, decodes
// and compares. It returns the stored size and codec.
func codecTestRoundTrip(t testing.TB, enc *Encoder, dec *Decoder, raw []byte) (int, Codec) {
	t.Helper()
	orig := bytes.Clone(raw)
	stored, codec := enc.Encode(raw)
	if !bytes.Equal(raw, orig) {
		t.Fatalf("Encode modified its input")
	}
	if _, err := ParseCodec(string(codec)); err != nil {
		t.Fatalf("Encode returned codec %q: %v", codec, err)
	}
	if len(stored) > len(raw) {
		t.Fatalf("stored %d bytes > raw %d bytes (%s)", len(stored), len(raw), codec)
	}
	if codec == CodecRaw {
		if len(stored) != len(raw) || (len(raw) > 0 && &stored[0] != &raw[0]) {
			t.Fatalf("CodecRaw result does not alias raw")
		}
	} else if !codecWorthIt(len(stored), len(raw)) {
		t.Fatalf("%s kept at %d/%d bytes, not below 97%%", codec, len(stored), len(raw))
	}
	n := len(stored)
	storedCopy := bytes.Clone(stored)
	got, err := dec.Decode(nil, stored, codec, len(raw))
	if err != nil {
		t.Fatalf("Decode(%s, %d -> %d bytes): %v", codec, len(stored), len(raw), err)
	}
	if !bytes.Equal(got, raw) {
		t.Fatalf("Decode(%s) returned different bytes (len %d, want %d)", codec, len(got), len(raw))
	}
	if !bytes.Equal(stored, storedCopy) {
		t.Fatalf("Decode modified its input")
	}
	// Decoding into a large enough dst uses it.
	buf := make([]byte, 3, len(raw)+5)
	got, err = dec.Decode(buf, stored, codec, len(raw))
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("Decode into dst: err %v, equal %v", err, bytes.Equal(got, raw))
	}
	if len(raw) > 0 && &got[0] != &buf[:1][0] {
		t.Fatalf("Decode did not decode into dst although cap(dst) >= rawLen")
	}
	return n, codec
}

func TestCodecRoundTrip(t *testing.T) {
	lengths := []int{64, 65, 66, 67, 100, 255, 1000, 4095, 32<<10 + 1, 96<<10 + 3, 100003, 1<<20 + 2, 4 << 20}
	for _, kind := range codecTestKinds {
		for _, m := range codecTestMethods {
			for _, elem := range []int{0, 2, 4} {
				if m != MethodAuto && elem != 0 {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/elem%d", kind.name, m, elem), func(t *testing.T) {
					enc, dec := NewEncoder(m, elem), NewDecoder()
					codecs := map[Codec]int{}
					for i, n := range lengths {
						_, c := codecTestRoundTrip(t, enc, dec, kind.gen(n, uint64(i)))
						codecs[c]++
					}
					t.Logf("codecs: %v", codecs)
				})
			}
		}
	}
}

func TestCodecTinyInputs(t *testing.T) {
	for _, m := range codecTestMethods {
		enc, dec := NewEncoder(m, 0), NewDecoder()
		for n := 0; n <= 17; n++ {
			for _, kind := range codecTestKinds {
				codecTestRoundTrip(t, enc, dec, kind.gen(n, uint64(n)))
			}
		}
	}
}

// codecTestChunked encodes data in chunks of chunkSize, checks that every
// chunk decodes back, and returns stored/raw and the codecs used.
func codecTestChunked(t *testing.T, enc *Encoder, data []byte, chunkSize int) (float64, map[Codec]int) {
	t.Helper()
	dec := NewDecoder()
	codecs := map[Codec]int{}
	total := 0
	for off := 0; off < len(data); off += chunkSize {
		n, c := codecTestRoundTrip(t, enc, dec, data[off:min(len(data), off+chunkSize)])
		total += n
		codecs[c]++
	}
	return float64(total) / float64(len(data)), codecs
}

// The target: bf16 weights of a trained model store at <= 0.72 of raw.
func TestCodecBF16Ratio(t *testing.T) {
	data := codecTestBF16(32<<20, 1, 0.02)
	for _, elem := range []int{0, 2} {
		ratio, codecs := codecTestChunked(t, NewEncoder(MethodAuto, elem), data, 4<<20)
		t.Logf("bf16 normal(0,0.02), auto, elemSize %d: ratio %.4f, codecs %v", elem, ratio, codecs)
		if ratio > 0.72 {
			t.Errorf("elemSize %d: ratio %.4f > 0.72", elem, ratio)
		}
		if codecs[CodecPlanes2] != 8 {
			t.Errorf("elemSize %d: codecs %v, want planes2 for all 8 chunks", elem, codecs)
		}
	}
	ratio, codecs := codecTestChunked(t, NewEncoder(MethodZstd, 0), data[:8<<20], 4<<20)
	t.Logf("bf16 normal(0,0.02), zstd: ratio %.4f, codecs %v", ratio, codecs)
}

func TestCodecFP32Ratio(t *testing.T) {
	data := codecTestFP32(16<<20, 2, 1)
	for _, elem := range []int{0, 4} {
		ratio, codecs := codecTestChunked(t, NewEncoder(MethodAuto, elem), data, 4<<20)
		t.Logf("fp32 normal(0,1), auto, elemSize %d: ratio %.4f, codecs %v", elem, ratio, codecs)
		// Three of four bytes are mostly mantissa noise; the exponent
		// byte compresses to about a third.
		if ratio > 0.86 {
			t.Errorf("elemSize %d: ratio %.4f > 0.86", elem, ratio)
		}
		if codecs[CodecPlanes4] != 4 {
			t.Errorf("elemSize %d: codecs %v, want planes4 for all 4 chunks", elem, codecs)
		}
	}
}

// codecTestPlaneMethods parses the planes header of stored (docs/codecs.md).
func codecTestPlaneMethods(t *testing.T, stored []byte, stride int) []byte {
	t.Helper()
	if len(stored) < 3+5*stride || stored[0] != 1 || int(stored[1]) != stride {
		t.Fatalf("bad planes header % x", stored[:min(len(stored), 3+5*stride)])
	}
	methods := make([]byte, stride)
	for k := range methods {
		methods[k] = stored[3+5*k]
	}
	return methods
}

func TestCodecBF16PlaneChoice(t *testing.T) {
	raw := codecTestBF16(4<<20, 3, 0.02)
	stored, codec := NewEncoder(MethodAuto, 0).Encode(raw)
	if codec != CodecPlanes2 {
		t.Fatalf("codec %s, want planes2", codec)
	}
	// Plane 0 is the low byte (exponent LSB and mantissa): noise, raw.
	// Plane 1 is sign and exponent: huff0.
	if got := codecTestPlaneMethods(t, stored, 2); !bytes.Equal(got, []byte{0, 1}) {
		t.Errorf("plane methods %v, want [0 1] (raw, huff0)", got)
	}
}

func TestCodecRandomStaysRaw(t *testing.T) {
	raw := codecTestRandom(4<<20, 4)
	for _, m := range codecTestMethods {
		for _, elem := range []int{0, 2, 4} {
			stored, codec := NewEncoder(m, elem).Encode(raw)
			if codec != CodecRaw || &stored[0] != &raw[0] || len(stored) != len(raw) {
				t.Errorf("%s elem %d: random data stored as %s (%d bytes)", m, elem, codec, len(stored))
			}
		}
	}
}

func TestCodecZeros(t *testing.T) {
	raw := make([]byte, 4<<20)
	dec := NewDecoder()
	for _, m := range []Method{MethodAuto, MethodZstd, MethodS2} {
		for _, elem := range []int{0, 2, 4} {
			n, codec := codecTestRoundTrip(t, NewEncoder(m, elem), dec, raw)
			t.Logf("%s elem %d: 4 MiB of zeros -> %d bytes (%s)", m, elem, n, codec)
			const limit = 1 << 10
			if n > limit {
				t.Errorf("%s elem %d: 4 MiB of zeros stored in %d bytes, want <= %d", m, elem, n, limit)
			}
		}
	}
}

func TestCodecMixedPlanes(t *testing.T) {
	// Half zeros, half bf16: a zero-heavy plane can go to zstd, the rest
	// stays huff0 or raw; whatever is chosen must round trip and compress.
	raw := codecTestMixed(4<<20, 5)
	n, codec := codecTestRoundTrip(t, NewEncoder(MethodAuto, 2), NewDecoder(), raw)
	t.Logf("mixed: %s, ratio %.4f", codec, float64(n)/float64(len(raw)))
	if float64(n) > 0.5*float64(len(raw)) {
		t.Errorf("mixed data ratio %.4f > 0.5", float64(n)/float64(len(raw)))
	}
}

func TestCodecEncoderReuse(t *testing.T) {
	// One Encoder across kinds and sizes, results used before the next call.
	enc, dec := NewEncoder(MethodAuto, 0), NewDecoder()
	for i := range 40 {
		kind := codecTestKinds[i%len(codecTestKinds)]
		n := []int{70, 5000, 200 << 10, 1 << 20}[i%4]
		codecTestRoundTrip(t, enc, dec, kind.gen(n, uint64(100+i)))
	}
}

func TestParseMethod(t *testing.T) {
	for in, want := range map[string]Method{"": MethodAuto, "none": MethodNone, "zstd": MethodZstd, "s2": MethodS2, "auto": MethodAuto, "ZSTD": MethodZstd} {
		if got, err := ParseMethod(in); err != nil || got != want {
			t.Errorf("ParseMethod(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"gzip", "lz4", "raw", "planes2"} {
		_, err := ParseMethod(in)
		if err == nil {
			t.Errorf("ParseMethod(%q) succeeded", in)
			continue
		}
		for _, name := range []string{"none", "zstd", "s2", "auto"} {
			if !strings.Contains(err.Error(), name) {
				t.Errorf("ParseMethod(%q) error %q does not list %q", in, err, name)
			}
		}
	}
}

func TestParseCodec(t *testing.T) {
	for _, c := range []Codec{CodecRaw, CodecZstd, CodecS2, CodecPlanes2, CodecPlanes4} {
		if got, err := ParseCodec(string(c)); err != nil || got != c {
			t.Errorf("ParseCodec(%q) = %q, %v", c, got, err)
		}
	}
	for _, in := range []string{"", "none", "auto", "RAW", "planes3", "planes8"} {
		if _, err := ParseCodec(in); err == nil {
			t.Errorf("ParseCodec(%q) succeeded", in)
		}
	}
}

// codecTestSplitRef is the definition of SplitPlanes.
func codecTestSplitRef(src []byte, stride int) []byte {
	m := len(src) / stride
	dst := make([]byte, 0, len(src))
	for k := range stride {
		for i := range m {
			dst = append(dst, src[i*stride+k])
		}
	}
	return append(dst, src[m*stride:]...)
}

func TestPlanesSplitJoin(t *testing.T) {
	for stride := 1; stride <= 5; stride++ {
		for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1021, 4096, 65537} {
			src := codecTestRandom(n, uint64(n*7+stride))
			want := codecTestSplitRef(src, stride)
			got := make([]byte, n)
			SplitPlanes(got, src, stride)
			if !bytes.Equal(got, want) {
				t.Fatalf("SplitPlanes(len %d, stride %d) differs from the definition", n, stride)
			}
			back := make([]byte, n+3) // longer dst is allowed
			JoinPlanes(back, got, stride)
			if !bytes.Equal(back[:n], src) {
				t.Fatalf("JoinPlanes(len %d, stride %d) does not invert SplitPlanes", n, stride)
			}
		}
	}
}

// codecTestValid returns valid stored forms of several codecs.
func codecTestValid(t *testing.T) map[Codec][]byte {
	t.Helper()
	valid := map[Codec][]byte{}
	add := func(m Method, elem int, raw []byte) {
		stored, c := NewEncoder(m, elem).Encode(raw)
		valid[c] = bytes.Clone(stored)
	}
	add(MethodAuto, 2, codecTestBF16(300<<10+1, 6, 0.02)) // 300 KiB: several huff0 blocks + tail
	add(MethodAuto, 4, codecTestFP32(200<<10+3, 7, 1))
	add(MethodZstd, 0, codecTestText(100<<10, 8))
	add(MethodS2, 0, codecTestText(100<<10, 9))
	for _, c := range []Codec{CodecPlanes2, CodecPlanes4, CodecZstd, CodecS2} {
		if valid[c] == nil {
			t.Fatalf("no valid %s sample: got %v", c, valid)
		}
	}
	return valid
}

var codecTestRawLens = map[Codec]int{CodecPlanes2: 300<<10 + 1, CodecPlanes4: 200<<10 + 3, CodecZstd: 100 << 10, CodecS2: 100 << 10}

// codecTestDecodeErr decodes and expects an error, failing on a panic, on
// success with a different length, or on success when mustFail.
func codecTestDecodeErr(t *testing.T, dec *Decoder, stored []byte, codec Codec, rawLen int, mustFail bool, what string) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s: Decode panicked: %v", what, r)
		}
	}()
	out, err := dec.Decode(nil, stored, codec, rawLen)
	switch {
	case err == nil && len(out) != rawLen:
		t.Fatalf("%s: Decode succeeded with %d bytes, want %d", what, len(out), rawLen)
	case err == nil && mustFail:
		t.Fatalf("%s: Decode succeeded", what)
	}
}

func TestCodecMalformed(t *testing.T) {
	dec := NewDecoder()
	valid := codecTestValid(t)
	for codec, stored := range valid {
		rawLen := codecTestRawLens[codec]
		if _, err := dec.Decode(nil, stored, codec, rawLen); err != nil {
			t.Fatalf("valid %s does not decode: %v", codec, err)
		}
		// Every truncation must fail: the stored size is exact.
		step := max(1, len(stored)/997)
		for n := 0; n < len(stored); n += step {
			codecTestDecodeErr(t, dec, stored[:n], codec, rawLen, true, fmt.Sprintf("%s truncated to %d", codec, n))
		}
		codecTestDecodeErr(t, dec, append(bytes.Clone(stored), 0), codec, rawLen, codec != CodecS2, fmt.Sprintf("%s with a trailing byte", codec))
		// Wrong rawLen.
		for _, n := range []int{0, 1, rawLen - 1, rawLen + 1, rawLen * 2, -1, codecMaxRawLen + 1} {
			codecTestDecodeErr(t, dec, stored, codec, n, true, fmt.Sprintf("%s with rawLen %d", codec, n))
		}
		// Other codec names for the same bytes.
		for _, other := range []Codec{CodecRaw, CodecZstd, CodecS2, CodecPlanes2, CodecPlanes4, "lz4", ""} {
			if other != codec {
				codecTestDecodeErr(t, dec, stored, other, rawLen, true, fmt.Sprintf("%s decoded as %q", codec, other))
			}
		}
		// Flipped bytes: headers must fail or give wrong bytes, never panic.
		r := codecTestRand(uint64(len(stored)))
		for i := range 3000 {
			bad := bytes.Clone(stored)
			pos := i
			if pos >= 64 {
				pos = r.IntN(len(bad))
			}
			if pos >= len(bad) {
				continue
			}
			bad[pos] ^= byte(1 << r.IntN(8))
			codecTestDecodeErr(t, dec, bad, codec, rawLen, false, fmt.Sprintf("%s with byte %d flipped", codec, pos))
		}
	}
}

func TestCodecMalformedPlanesHeader(t *testing.T) {
	dec := NewDecoder()
	stored := codecTestValid(t)[CodecPlanes2]
	rawLen := codecTestRawLens[CodecPlanes2]
	set := func(pos int, v byte) []byte {
		b := bytes.Clone(stored)
		b[pos] = v
		return b
	}
	set32 := func(pos int, v uint32) []byte {
		b := bytes.Clone(stored)
		binary.LittleEndian.PutUint32(b[pos:], v)
		return b
	}
	cases := map[string][]byte{
		"version 0":          set(0, 0),
		"version 2":          set(0, 2),
		"stride 4":           set(1, 4),
		"stride 0":           set(1, 0),
		"block log 9":        set(2, 9),
		"block log 18":       set(2, 18),
		"block log 255":      set(2, 255),
		"plane 0 method 3":   set(3, 3),
		"plane 1 method 255": set(8, 255),
		"plane 0 as huff0":   set(3, 1),
		"plane 1 as raw":     set(8, 0),
		"plane 1 as zstd":    set(8, 2),
		"plane 0 len +1":     set32(4, binary.LittleEndian.Uint32(stored[4:])+1),
		"plane 0 len -1":     set32(4, binary.LittleEndian.Uint32(stored[4:])-1),
		"plane 1 len huge":   set32(9, 0xFFFFFFFF),
		"plane 1 len 0":      set32(9, 0),
		"first block kind 7": set(13+int(binary.LittleEndian.Uint32(stored[4:])), 7),
		"header only":        stored[:13],
	}
	for name, bad := range cases {
		codecTestDecodeErr(t, dec, bad, CodecPlanes2, rawLen, true, name)
	}
	if got := codecTestPlaneMethods(t, stored, 2); !bytes.Equal(got, []byte{0, 1}) {
		t.Fatalf("test assumes plane methods [0 1], got %v", got)
	}
}

func TestCodecDecodeHostileSizes(t *testing.T) {
	dec := NewDecoder()
	// A tiny payload must not make Decode allocate a huge rawLen.
	hdr := []byte{1, 2, 17, 1, 2, 0, 0, 0, 1, 2, 0, 0, 0, 1, 0, 1, 0}
	for _, c := range []Codec{CodecRaw, CodecZstd, CodecS2, CodecPlanes2, CodecPlanes4} {
		for _, n := range []int{1 << 30, 1<<30 + 1, math.MaxInt} {
			if _, err := dec.Decode(nil, hdr, c, n); err == nil {
				t.Errorf("%s: rawLen %d decoded from %d bytes", c, n, len(hdr))
			}
		}
	}
	// An s2 block claiming 1 GiB.
	s2hdr := binary.AppendUvarint(nil, 1<<30)
	if _, err := dec.Decode(nil, append(s2hdr, 0, 0, 0), CodecS2, 100); err == nil {
		t.Error("s2 header with wrong length accepted")
	}
}

func BenchmarkEncodeAuto(b *testing.B) {
	raw := codecTestBF16(4<<20, 10, 0.02)
	enc := NewEncoder(MethodAuto, 0)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	var n int
	for b.Loop() {
		stored, _ := enc.Encode(raw)
		n = len(stored)
	}
	b.ReportMetric(float64(n)/float64(len(raw)), "ratio")
}

// BenchmarkEncodeHurried compares auto's encoding of text-like chunks
// (zstd) with its hurried encoding (s2), speed and ratio.
func BenchmarkEncodeHurried(b *testing.B) {
	raw := codecTestText(4<<20, 12)
	for _, hurried := range []bool{false, true} {
		b.Run(fmt.Sprintf("hurried=%v", hurried), func(b *testing.B) {
			enc := NewEncoder(MethodAuto, 0)
			encode := enc.Encode
			if hurried {
				encode = enc.EncodeHurried
			}
			b.SetBytes(int64(len(raw)))
			var n int
			for b.Loop() {
				stored, _ := encode(raw)
				n = len(stored)
			}
			b.ReportMetric(float64(n)/float64(len(raw)), "ratio")
		})
	}
}

func BenchmarkEncodeAutoRandom(b *testing.B) {
	raw := codecTestRandom(4<<20, 11)
	enc := NewEncoder(MethodAuto, 0)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		enc.Encode(raw)
	}
}

func BenchmarkDecode(b *testing.B) {
	raw := codecTestBF16(4<<20, 10, 0.02)
	stored, codec := NewEncoder(MethodAuto, 0).Encode(raw)
	stored = bytes.Clone(stored)
	dec := NewDecoder()
	dst := make([]byte, len(raw))
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := dec.Decode(dst, stored, codec, len(raw)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlanesSplitJoin(b *testing.B) {
	raw := codecTestBF16(4<<20, 10, 0.02)
	planes := make([]byte, len(raw))
	for _, stride := range []int{2, 4} {
		b.Run(fmt.Sprintf("split%d", stride), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				SplitPlanes(planes, raw, stride)
			}
		})
		b.Run(fmt.Sprintf("join%d", stride), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				JoinPlanes(raw, planes, stride)
			}
		})
	}
}

// Corrupted huff0 blocks must never make the decoder write outside the
// block it decodes: the huff0 decoders run assembly that checks bounds
// only between batches of symbols.
func TestCodecHuffBlockBounds(t *testing.T) {
	enc, dec := NewEncoder(MethodAuto, 0), NewDecoder()
	r := codecTestRand(12)
	var blocks [][]byte
	var sizes []int
	for _, n := range []int{256, 300, 801, 4099, 65536, 128 << 10} {
		for _, sigma := range []float64{0.02, 1e-30} {
			plane := make([]byte, n)
			SplitPlanes(plane, codecTestBF16(n, uint64(n), sigma), 2)
			p := plane[n/2:] // the sign/exponent plane, twice
			p = append(p, plane[n/2:]...)[:n]
			kind, data := enc.huffBlock(p)
			if kind != planeBlockHuff {
				continue
			}
			blocks = append(blocks, bytes.Clone(data))
			sizes = append(sizes, n)
		}
	}
	if len(blocks) < 6 {
		t.Fatalf("only %d huff0 blocks to corrupt", len(blocks))
	}
	const guard = 64
	buf := make([]byte, (128<<10)+2*guard)
	for i := range 10000 {
		j := i % len(blocks)
		n := sizes[j]
		bad := bytes.Clone(blocks[j])
		for range 1 + r.IntN(4) {
			bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
		}
		if r.IntN(8) == 0 {
			bad = bad[:r.IntN(len(bad))]
		}
		before, after := buf[:guard], buf[guard+n:guard+n+guard]
		for k := range guard {
			before[k], after[k] = 0xA5, 0xA5
		}
		_ = dec.decodeHuffBlock(buf[guard:guard+n:guard+n], bad)
		for k := range guard {
			if before[k] != 0xA5 || after[k] != 0xA5 {
				t.Fatalf("decoding a corrupted %d-byte block wrote outside it", n)
			}
		}
	}
}

// The worked example of docs/codecs.md decodes as documented.
func TestCodecPlanesSpecExample(t *testing.T) {
	stored := []byte{
		0x01, 0x02, 0x11,
		0x00, 0x05, 0x00, 0x00, 0x00,
		0x00, 0x05, 0x00, 0x00, 0x00,
		0x00, 0x01, 0x02, 0x03, 0x04,
		0x3c, 0x3c, 0xbc, 0xbc, 0x3d,
	}
	want := []byte{0x00, 0x3c, 0x01, 0x3c, 0x02, 0xbc, 0x03, 0xbc, 0x04, 0x3d}
	got, err := NewDecoder().Decode(nil, stored, CodecPlanes2, len(want))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("Decode = % x, %v; want % x", got, err, want)
	}
	// With a tail byte appended to both.
	got, err = NewDecoder().Decode(nil, append(stored, 0x7f), CodecPlanes2, len(want)+1)
	if err != nil || !bytes.Equal(got, append(want, 0x7f)) {
		t.Fatalf("Decode with tail = % x, %v", got, err)
	}
}

// TestCodecHurried: EncodeHurried takes s2 where Encode takes zstd for data
// that does not shrink thirty-fold, and keeps the other choices: zstd for
// zeros, raw for random bytes, planes for bf16; each decodes back.
func TestCodecHurried(t *testing.T) {
	dec := NewDecoder()
	for _, c := range []struct {
		name         string
		raw          []byte
		method       Method
		plain, hurry Codec
	}{
		{"text auto", codecTestText(4<<20, 5), MethodAuto, CodecZstd, CodecS2},
		{"text zstd", codecTestText(4<<20, 5), MethodZstd, CodecZstd, CodecS2},
		{"zeros auto", make([]byte, 4<<20), MethodAuto, CodecZstd, CodecZstd},
		{"random auto", codecTestRandom(4<<20, 6), MethodAuto, CodecRaw, CodecRaw},
		{"bf16 auto", codecTestBF16(4<<20, 3, 0.02), MethodAuto, CodecPlanes2, CodecPlanes2},
		{"text s2", codecTestText(4<<20, 5), MethodS2, CodecS2, CodecS2},
	} {
		enc := NewEncoder(c.method, 0)
		if _, codec := enc.Encode(c.raw); codec != c.plain {
			t.Errorf("%s: Encode took %s, want %s", c.name, codec, c.plain)
		}
		stored, codec := enc.EncodeHurried(c.raw)
		if codec != c.hurry {
			t.Errorf("%s: EncodeHurried took %s, want %s", c.name, codec, c.hurry)
			continue
		}
		got, err := dec.Decode(nil, stored, codec, len(c.raw))
		if err != nil || !bytes.Equal(got, c.raw) {
			t.Errorf("%s: %s does not decode back (%v)", c.name, codec, err)
		}
	}
}
