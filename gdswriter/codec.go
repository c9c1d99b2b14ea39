package gdswriter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Method is what the user asks for: --compress none|zstd|s2|auto.
type Method string

const (
	MethodNone Method = "none"
	MethodZstd Method = "zstd"
	MethodS2   Method = "s2"
	MethodAuto Method = "auto"
)

// ParseMethod accepts "none", "zstd", "s2" and "auto" (case-insensitive);
// the empty string means auto.
func ParseMethod(s string) (Method, error) {
	switch m := Method(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return MethodAuto, nil
	case MethodNone, MethodZstd, MethodS2, MethodAuto:
		return m, nil
	}
	return "", fmt.Errorf("gdswriter: unknown compression method %q (valid: none, zstd, s2, auto)", s)
}

// Codec names how one stored chunk is encoded; the manifest's chunk table
// records it as a string. docs/codecs.md specifies each format.
type Codec string

const (
	CodecRaw     Codec = "raw"     // stored as is
	CodecZstd    Codec = "zstd"    // one zstd frame of the whole chunk
	CodecS2      Codec = "s2"      // one s2 block of the whole chunk
	CodecPlanes2 Codec = "planes2" // byte planes with stride 2 (bf16/fp16), each plane coded on its own
	CodecPlanes4 Codec = "planes4" // byte planes with stride 4 (fp32)
)

// ParseCodec validates a codec name read from a manifest.
func ParseCodec(s string) (Codec, error) {
	switch c := Codec(s); c {
	case CodecRaw, CodecZstd, CodecS2, CodecPlanes2, CodecPlanes4:
		return c, nil
	}
	return "", fmt.Errorf("gdswriter: unknown chunk codec %q (valid: raw, zstd, s2, planes2, planes4)", s)
}

// planesStride returns the stride of a planes codec, or 0.
func (c Codec) planesStride() int {
	switch c {
	case CodecPlanes2:
		return 2
	case CodecPlanes4:
		return 4
	}
	return 0
}

const (
	// codecMinLen: shorter chunks are always stored raw.
	codecMinLen = 64
	// codecSampleSlice and codecSampleSlices size the sample auto looks at.
	codecSampleSlice  = 32 << 10
	codecSampleSlices = 3
	// codecMaxRawLen bounds rawLen in Decode, whatever the manifest says
	// (the format allows chunks of up to 256 MiB).
	codecMaxRawLen = 1 << 30
	// codecZstdNoFCSMax: a zstd frame without a declared content size is
	// accepted only for chunks (or planes) up to this size.
	codecZstdNoFCSMax = 64 << 10

	planesVersion      = 1
	planesBlockLog     = 17 // huff0 blocks of 128 KiB
	planesMinBlockLog  = 10
	planesMaxBlockLog  = 17
	planesFixedHdr     = 3   // version, stride, blockLog
	planesPerPlaneHdr  = 5   // method, u32 length
	planesMinHuffBlock = 256 // shorter blocks are stored raw or RLE
)

// planesHeaderLen is the size of the header of a planes payload.
func planesHeaderLen(stride int) int { return planesFixedHdr + planesPerPlaneHdr*stride }

// planeMethod is how one plane of a planes payload is coded.
type planeMethod uint8

const (
	planeRaw  planeMethod = 0
	planeHuff planeMethod = 1 // a sequence of blocks, see planeBlock*
	planeZstd planeMethod = 2 // one zstd frame
)

// Kinds of blocks inside a planeHuff plane.
const (
	planeBlockRaw  = 0
	planeBlockRLE  = 1
	planeBlockHuff = 2
)

// codecWorthIt reports whether n stored bytes are worth keeping instead of
// rawLen raw bytes: they must be below 97% of the raw size.
func codecWorthIt(n, rawLen int) bool {
	return int64(n)*100 < int64(rawLen)*97
}

// Encoder compresses chunks. It is not safe for concurrent use; use one
// per goroutine. It may be reused for any number of chunks.
type Encoder struct {
	method  Method
	strides []int

	zstd *zstd.Encoder // created on first use
	huff huff0.Scratch

	out    []byte // stored form returned by Encode
	planes []byte // SplitPlanes output of the chunk
	sample []byte // the sample auto estimates on
	splane []byte // SplitPlanes output of the sample
	est    []byte // scratch output of estimates
	plan   [4]planeMethod
	tplan  [4]planeMethod
}

// NewEncoder returns an Encoder for method m. elemSize hints at the width
// of the data's elements: 2 (bf16/fp16), 4 (fp32) or 0 (unknown). Under
// MethodAuto it picks which byte-plane strides are tried: both for 0 (and
// any other value), only the given one for 2 or 4. An unknown method
// behaves as MethodAuto.
func NewEncoder(m Method, elemSize int) *Encoder {
	e := &Encoder{method: m}
	switch m {
	case MethodNone, MethodZstd, MethodS2, MethodAuto:
	default:
		e.method = MethodAuto
	}
	switch elemSize {
	case 2:
		e.strides = []int{2}
	case 4:
		e.strides = []int{4}
	default:
		e.strides = []int{2, 4}
	}
	// Every huff0 block must carry its own table.
	e.huff.Reuse = huff0.ReusePolicyNone
	return e
}

// Encode returns the stored form of raw and its codec. stored is raw itself
// for CodecRaw; otherwise it lies in the Encoder's scratch and stays valid
// until the next Encode call. len(stored) <= len(raw) always holds, and a
// compressed result is kept only when it is below 97% of len(raw). Encode
// never fails and never modifies raw.
func (e *Encoder) Encode(raw []byte) (stored []byte, codec Codec) {
	return e.encode(raw, false)
}

// EncodeHurried is Encode for a caller that waits: where Encode would take
// zstd for data that zstd does not shrink thirty-fold (the zeros it does
// are as fast either way), it takes s2, several times faster, or raw
// where s2 does not pay. auto's other choices (raw, byte planes) stand.
func (e *Encoder) EncodeHurried(raw []byte) (stored []byte, codec Codec) {
	return e.encode(raw, true)
}

func (e *Encoder) encode(raw []byte, hurried bool) ([]byte, Codec) {
	if len(raw) < codecMinLen || len(raw) > codecMaxRawLen {
		return raw, CodecRaw
	}
	switch e.method {
	case MethodZstd:
		if hurried {
			return e.encodeS2(raw)
		}
		return e.encodeZstd(raw)
	case MethodS2:
		return e.encodeS2(raw)
	case MethodAuto:
		return e.encodeAuto(raw, hurried)
	}
	return raw, CodecRaw
}

func (e *Encoder) zstdEncoder() *zstd.Encoder {
	if e.zstd == nil {
		z, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(false), // the manifest has a CRC32C of raw bytes
		)
		if err != nil {
			panic("gdswriter: zstd encoder: " + err.Error()) // fixed, valid options
		}
		e.zstd = z
	}
	return e.zstd
}

// outBuf returns e.out emptied, with room for at least n bytes.
func (e *Encoder) outBuf(n int) []byte {
	if cap(e.out) < n {
		e.out = make([]byte, 0, n)
	}
	return e.out[:0]
}

func (e *Encoder) encodeZstd(raw []byte) ([]byte, Codec) {
	out := e.zstdEncoder().EncodeAll(raw, e.outBuf(len(raw)))
	e.out = out[:0]
	if !codecWorthIt(len(out), len(raw)) {
		return raw, CodecRaw
	}
	return out, CodecZstd
}

func (e *Encoder) encodeS2(raw []byte) ([]byte, Codec) {
	n := s2.MaxEncodedLen(len(raw))
	if n < 0 {
		return raw, CodecRaw
	}
	out := s2.Encode(e.outBuf(n)[:n], raw)
	if !codecWorthIt(len(out), len(raw)) {
		return raw, CodecRaw
	}
	return out, CodecS2
}

// takeSample gathers up to codecSampleSlices slices of codecSampleSlice
// bytes from the start, middle and end of raw, each starting at a multiple
// of 4 so that byte planes line up with those of the whole chunk. A short
// chunk is its own sample (cut to a multiple of 4).
func (e *Encoder) takeSample(raw []byte) []byte {
	if len(raw) <= codecSampleSlice*codecSampleSlices {
		return raw[:len(raw)&^3]
	}
	s := e.sample[:0]
	last := len(raw) - codecSampleSlice
	for i := range codecSampleSlices {
		off := (last * i / (codecSampleSlices - 1)) &^ 3
		s = append(s, raw[off:off+codecSampleSlice]...)
	}
	e.sample = s
	return s
}

// encodeAuto estimates on a sample which of raw, zstd and the planes codecs
// stores smallest and encodes the chunk with it; hurried, with s2 where
// that is zstd (EncodeHurried).
func (e *Encoder) encodeAuto(raw []byte, hurried bool) ([]byte, Codec) {
	sample := e.takeSample(raw)
	n := len(sample)
	best, bestSize := CodecRaw, n
	z := e.zstdSize(sample)
	if codecWorthIt(z, n) {
		best, bestSize = CodecZstd, z
	}
	// What zstd shrinks thirty-fold or more (mostly zeros, as much of a
	// process's memory is) is not worth trying planes on: they could save
	// a thirty-second of the chunk at most, and splitting and counting
	// the planes of a whole chunk costs several times zstd's time.
	if z <= n/32 {
		return e.encodeZstd(raw)
	}
	// Plain zstd finding matches hints that planes may have them too.
	repeats := z < n-n/8
	for _, stride := range e.strides {
		size := e.estimatePlanes(sample, stride, repeats)
		if size < bestSize && codecWorthIt(size, n) {
			best, bestSize = planesCodec(stride), size
			e.plan = e.tplan
		}
	}
	switch {
	case best == CodecZstd && hurried:
		return e.encodeS2(raw)
	case best == CodecZstd:
		return e.encodeZstd(raw)
	case best == CodecPlanes2, best == CodecPlanes4:
		return e.encodePlanes(raw, best.planesStride(), e.plan)
	}
	return raw, CodecRaw
}

func planesCodec(stride int) Codec {
	if stride == 4 {
		return CodecPlanes4
	}
	return CodecPlanes2
}

// zstdSize is the size of src compressed with zstd.
func (e *Encoder) zstdSize(src []byte) int {
	if cap(e.est) < len(src) {
		e.est = make([]byte, 0, len(src))
	}
	out := e.zstdEncoder().EncodeAll(src, e.est[:0])
	e.est = out[:0]
	return len(out)
}

// estimatePlanes returns the estimated size of the planes payload of sample
// with the given stride, and leaves the per-plane choice in e.tplan. Each
// plane takes huff0 unless that saves under 1/32 (then raw), and zstd only
// where it is clearly (1/8) smaller than that: huff0 decodes much faster.
func (e *Encoder) estimatePlanes(sample []byte, stride int, repeats bool) int {
	m := len(sample) / stride
	if cap(e.splane) < m*stride {
		e.splane = make([]byte, m*stride)
	}
	planes := e.splane[:m*stride]
	SplitPlanes(planes, sample[:m*stride], stride)
	total := planesHeaderLen(stride) + len(sample) - m*stride
	for k := range stride {
		p := planes[k*m : (k+1)*m]
		method, size := planeRaw, m
		if h := e.huffPlaneSize(p); h < m-m/32 {
			method, size = planeHuff, h
		}
		if repeats || method == planeHuff {
			if z := e.zstdSize(p); z < size-size/8 {
				method, size = planeZstd, z
			}
		}
		e.tplan[k] = method
		total += size
	}
	return total
}

// huffPlaneSize is the size of p coded as a planeHuff plane.
func (e *Encoder) huffPlaneSize(p []byte) int {
	size := 0
	for len(p) > 0 {
		blk := p[:min(len(p), 1<<planesBlockLog)]
		p = p[len(blk):]
		kind, data := e.huffBlock(blk)
		switch kind {
		case planeBlockRLE:
			size += 2
		case planeBlockHuff:
			size += 5 + len(data)
		default:
			size += 1 + len(blk)
		}
	}
	return size
}

// huffBlock chooses how one block of a planeHuff plane is coded. For
// planeBlockHuff the returned data lies in e.huff and is valid until the
// next huff0 call.
func (e *Encoder) huffBlock(blk []byte) (kind byte, data []byte) {
	if len(blk) < planesMinHuffBlock {
		for _, b := range blk {
			if b != blk[0] {
				return planeBlockRaw, nil
			}
		}
		return planeBlockRLE, nil
	}
	out, _, err := huff0.Compress4X(blk, &e.huff)
	switch {
	case err == huff0.ErrUseRLE:
		return planeBlockRLE, nil
	case err != nil || len(out)+4 >= len(blk):
		return planeBlockRaw, nil
	}
	return planeBlockHuff, out
}

// encodePlanes encodes raw as a planes payload (docs/codecs.md) with the
// per-plane methods of plan, falling back to CodecRaw when that does not
// pay off.
func (e *Encoder) encodePlanes(raw []byte, stride int, plan [4]planeMethod) ([]byte, Codec) {
	m := len(raw) / stride
	body := m * stride
	if cap(e.planes) < body {
		e.planes = make([]byte, body)
	}
	planes := e.planes[:body]
	SplitPlanes(planes, raw[:body], stride)

	limit := len(raw) - len(raw)*3/100 // stay below 97%
	hdr := planesHeaderLen(stride)
	out := e.outBuf(len(raw) + hdr + 64)[:hdr]
	out[0] = planesVersion
	out[1] = byte(stride)
	out[2] = planesBlockLog
	for k := range stride {
		p := planes[k*m : (k+1)*m]
		start := len(out)
		method := plan[k]
		switch method {
		case planeHuff:
			out = e.appendHuffPlane(out, p)
		case planeZstd:
			out = e.zstdEncoder().EncodeAll(p, out)
			if len(out)-start >= m {
				out = append(out[:start], p...)
				method = planeRaw
			}
		default:
			method = planeRaw
			out = append(out, p...)
		}
		h := out[planesFixedHdr+planesPerPlaneHdr*k:]
		h[0] = byte(method)
		binary.LittleEndian.PutUint32(h[1:5], uint32(len(out)-start))
		if len(out) >= limit {
			e.out = out[:0]
			return raw, CodecRaw
		}
	}
	out = append(out, raw[body:]...)
	e.out = out[:0]
	if !codecWorthIt(len(out), len(raw)) {
		return raw, CodecRaw
	}
	return out, planesCodec(stride)
}

// appendHuffPlane appends p coded as a planeHuff plane to out.
func (e *Encoder) appendHuffPlane(out, p []byte) []byte {
	for len(p) > 0 {
		blk := p[:min(len(p), 1<<planesBlockLog)]
		p = p[len(blk):]
		kind, data := e.huffBlock(blk)
		out = append(out, kind)
		switch kind {
		case planeBlockRLE:
			out = append(out, blk[0])
		case planeBlockHuff:
			out = binary.LittleEndian.AppendUint32(out, uint32(len(data)))
			out = append(out, data...)
		default:
			out = append(out, blk...)
		}
	}
	return out
}

// Decoder decompresses chunks. It is not safe for concurrent use; use one
// per goroutine. It may be reused for any number of chunks.
type Decoder struct {
	zstd   *zstd.Decoder // created on first use
	huff   *huff0.Scratch
	planes []byte // decoded planes
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder { return &Decoder{} }

var errCodecCorrupt = errors.New("gdswriter: corrupt compressed chunk")

func codecCorrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errCodecCorrupt}, args...)...)
}

// Decode decodes stored, of the given codec, into dst[:rawLen] and returns
// that slice; when cap(dst) < rawLen it allocates a new one, but only after
// the stored header has been checked against rawLen. Malformed input, or
// input that does not decode to exactly rawLen bytes, yields an error.
// Corruption that slips through shows up as wrong bytes, which the caller's
// CRC32C of the raw bytes catches. dst must not overlap stored.
func (d *Decoder) Decode(dst, stored []byte, codec Codec, rawLen int) ([]byte, error) {
	if rawLen < 0 || rawLen > codecMaxRawLen {
		return nil, fmt.Errorf("gdswriter: chunk raw length %d out of range [0, %d]", rawLen, codecMaxRawLen)
	}
	switch codec {
	case CodecRaw:
		if len(stored) != rawLen {
			return nil, codecCorrupt("raw chunk has %d bytes, want %d", len(stored), rawLen)
		}
		dst = codecSized(dst, rawLen)
		copy(dst, stored)
		return dst, nil
	case CodecZstd:
		if err := codecCheckZstd(stored, rawLen); err != nil {
			return nil, err
		}
		dst = codecSized(dst, rawLen)
		if err := d.decodeZstd(dst, stored); err != nil {
			return nil, err
		}
		return dst, nil
	case CodecS2:
		return codecDecodeS2(dst, stored, rawLen)
	case CodecPlanes2, CodecPlanes4:
		return d.decodePlanes(dst, stored, codec.planesStride(), rawLen)
	}
	return nil, fmt.Errorf("gdswriter: unknown chunk codec %q", string(codec))
}

// codecSized returns dst[:n], allocating when dst is too small.
func codecSized(dst []byte, n int) []byte {
	if cap(dst) < n {
		return make([]byte, n)
	}
	return dst[:n]
}

func codecDecodeS2(dst, stored []byte, rawLen int) ([]byte, error) {
	n, err := s2.DecodedLen(stored)
	if err != nil {
		return nil, codecCorrupt("s2: %v", err)
	}
	if n != rawLen {
		return nil, codecCorrupt("s2 block decodes to %d bytes, want %d", n, rawLen)
	}
	dst = codecSized(dst, rawLen)
	out, err := s2.Decode(dst, stored)
	if err != nil {
		return nil, codecCorrupt("s2: %v", err)
	}
	if len(out) != rawLen || (rawLen > 0 && &out[0] != &dst[0]) {
		return nil, codecCorrupt("s2 block decodes to %d bytes, want %d", len(out), rawLen)
	}
	return dst, nil
}

// codecCheckZstd checks that src starts with a plain zstd frame header
// that agrees with a decoded size of n.
func codecCheckZstd(src []byte, n int) error {
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return codecCorrupt("zstd header: %v", err)
	}
	switch {
	case h.Skippable:
		return codecCorrupt("zstd: skippable frame")
	case h.DictionaryID != 0:
		return codecCorrupt("zstd: frame needs dictionary %d", h.DictionaryID)
	case h.HasFCS && h.FrameContentSize != uint64(n):
		return codecCorrupt("zstd frame declares %d bytes, want %d", h.FrameContentSize, n)
	case !h.HasFCS && n > codecZstdNoFCSMax:
		return codecCorrupt("zstd frame of %d bytes declares no content size", n)
	}
	return nil
}

// decodeZstd decodes src into all of dst, never writing beyond it.
func (d *Decoder) decodeZstd(dst, src []byte) error {
	if d.zstd == nil {
		z, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecodeAllCapLimit(true), // output never grows past cap(dst)
			zstd.WithDecoderMaxMemory(codecMaxRawLen),
			zstd.WithDecoderLowmem(true),
		)
		if err != nil {
			return fmt.Errorf("gdswriter: zstd decoder: %w", err)
		}
		d.zstd = z
	}
	out, err := d.zstd.DecodeAll(src, dst[:0:len(dst)])
	if err != nil {
		return codecCorrupt("zstd: %v", err)
	}
	if len(out) != len(dst) || (len(dst) > 0 && &out[0] != &dst[0]) {
		return codecCorrupt("zstd frame decodes to %d bytes, want %d", len(out), len(dst))
	}
	return nil
}

// decodePlanes decodes a planes payload (docs/codecs.md). The whole header
// is validated against rawLen and len(stored) before anything is allocated.
func (d *Decoder) decodePlanes(dst, stored []byte, stride, rawLen int) ([]byte, error) {
	m := rawLen / stride
	hdr := planesHeaderLen(stride)
	if len(stored) < hdr {
		return nil, codecCorrupt("planes header truncated (%d bytes)", len(stored))
	}
	if stored[0] != planesVersion {
		return nil, codecCorrupt("planes version %d, want %d", stored[0], planesVersion)
	}
	if int(stored[1]) != stride {
		return nil, codecCorrupt("planes stride %d, want %d", stored[1], stride)
	}
	blockLog := int(stored[2])
	if blockLog < planesMinBlockLog || blockLog > planesMaxBlockLog {
		return nil, codecCorrupt("planes block log %d out of range", blockLog)
	}
	blockSize := 1 << blockLog
	var (
		methods  [4]planeMethod
		payloads [4][]byte
		decoded  int // planes that need room in d.planes
	)
	rest := stored[hdr:]
	for k := range stride {
		h := stored[planesFixedHdr+planesPerPlaneHdr*k:]
		method := planeMethod(h[0])
		n := binary.LittleEndian.Uint32(h[1:5])
		if uint64(n) > uint64(len(rest)) {
			return nil, codecCorrupt("plane %d: %d bytes, only %d left", k, n, len(rest))
		}
		p := rest[:n]
		rest = rest[n:]
		switch method {
		case planeRaw:
			if len(p) != m {
				return nil, codecCorrupt("raw plane %d has %d bytes, want %d", k, len(p), m)
			}
		case planeHuff:
			// Every block takes at least 2 bytes.
			if blocks := (m + blockSize - 1) / blockSize; blocks > len(p)/2 {
				return nil, codecCorrupt("huff0 plane %d: %d bytes cannot hold %d blocks", k, len(p), blocks)
			}
			decoded++
		case planeZstd:
			if err := codecCheckZstd(p, m); err != nil {
				return nil, fmt.Errorf("plane %d: %w", k, err)
			}
			decoded++
		default:
			return nil, codecCorrupt("plane %d: unknown method %d", k, method)
		}
		methods[k], payloads[k] = method, p
	}
	if len(rest) != rawLen-m*stride {
		return nil, codecCorrupt("planes tail has %d bytes, want %d", len(rest), rawLen-m*stride)
	}

	dst = codecSized(dst, rawLen)
	if cap(d.planes) < decoded*m {
		d.planes = make([]byte, decoded*m)
	}
	var views [4][]byte
	free := d.planes[:decoded*m]
	for k := range stride {
		if methods[k] == planeRaw {
			views[k] = payloads[k]
			continue
		}
		v := free[:m:m]
		free = free[m:]
		var err error
		if methods[k] == planeHuff {
			err = d.decodeHuffPlane(v, payloads[k], blockSize)
		} else {
			err = d.decodeZstd(v, payloads[k])
		}
		if err != nil {
			return nil, fmt.Errorf("plane %d: %w", k, err)
		}
		views[k] = v
	}
	planesJoin(dst[:m*stride], views[:stride])
	copy(dst[m*stride:], rest)
	return dst, nil
}

// decodeHuffPlane decodes the blocks of a planeHuff plane into all of dst.
func (d *Decoder) decodeHuffPlane(dst, src []byte, blockSize int) error {
	for off := 0; off < len(dst); off += blockSize {
		blk := dst[off:min(off+blockSize, len(dst))]
		if len(src) < 2 {
			return codecCorrupt("huff0 plane truncated at offset %d", off)
		}
		kind := src[0]
		src = src[1:]
		switch kind {
		case planeBlockRaw:
			if len(src) < len(blk) {
				return codecCorrupt("raw block truncated at offset %d", off)
			}
			copy(blk, src)
			src = src[len(blk):]
		case planeBlockRLE:
			v := src[0]
			src = src[1:]
			if v == 0 {
				clear(blk)
			} else {
				for i := range blk {
					blk[i] = v
				}
			}
		case planeBlockHuff:
			if len(src) < 4 {
				return codecCorrupt("huff0 block truncated at offset %d", off)
			}
			n := binary.LittleEndian.Uint32(src)
			src = src[4:]
			if uint64(n) > uint64(len(src)) {
				return codecCorrupt("huff0 block at offset %d: %d bytes, only %d left", off, n, len(src))
			}
			if err := d.decodeHuffBlock(blk, src[:n]); err != nil {
				return codecCorrupt("huff0 block at offset %d: %v", off, err)
			}
			src = src[n:]
		default:
			return codecCorrupt("unknown block kind %d at offset %d", kind, off)
		}
	}
	if len(src) != 0 {
		return codecCorrupt("huff0 plane has %d trailing bytes", len(src))
	}
	return nil
}

// decodeHuffBlock decodes one huff0 4-stream block (table included) into
// all of dst.
func (d *Decoder) decodeHuffBlock(dst, src []byte) error {
	s, streams, err := huff0.ReadTable(src, d.huff)
	if err != nil {
		return err
	}
	d.huff = s
	out, err := s.Decoder().Decompress4X(dst[:0:len(dst)], streams)
	if err != nil {
		return err
	}
	if len(out) != len(dst) || (len(dst) > 0 && &out[0] != &dst[0]) {
		return fmt.Errorf("decodes to %d bytes, want %d", len(out), len(dst))
	}
	return nil
}

// SplitPlanes writes the byte planes of src to dst: plane k holds src[k],
// src[k+stride], src[k+2*stride], ..., the planes lie one after another,
// and the len(src)%stride tail bytes follow unchanged. dst must hold
// len(src) bytes; stride must be at least 1.
func SplitPlanes(dst, src []byte, stride int) {
	if stride < 1 {
		panic("gdswriter: SplitPlanes stride < 1")
	}
	dst = dst[:len(src)]
	m := len(src) / stride
	body := m * stride
	var views [4][]byte
	switch stride {
	case 2:
		planesSplit2(dst[:m], dst[m:2*m], src[:body])
	case 4:
		for k := range views {
			views[k] = dst[k*m : (k+1)*m]
		}
		planesSplit4(&views, src[:body])
	default:
		for k := range stride {
			p := dst[k*m : (k+1)*m]
			for i := range p {
				p[i] = src[i*stride+k]
			}
		}
	}
	copy(dst[body:], src[body:])
}

// JoinPlanes inverts SplitPlanes: src holds the planes of len(src) bytes of
// data with the given stride, and dst (at least len(src) bytes) receives
// the data.
func JoinPlanes(dst, src []byte, stride int) {
	if stride < 1 {
		panic("gdswriter: JoinPlanes stride < 1")
	}
	dst = dst[:len(src)]
	m := len(src) / stride
	body := m * stride
	if stride == 2 || stride == 4 {
		var views [4][]byte
		for k := range stride {
			views[k] = src[k*m : (k+1)*m]
		}
		planesJoin(dst[:body], views[:stride])
	} else {
		for k := range stride {
			p := src[k*m : (k+1)*m]
			for i, b := range p {
				dst[i*stride+k] = b
			}
		}
	}
	copy(dst[body:], src[body:])
}

// planesJoin interleaves len(planes) equal-length planes (2 or 4 of
// them) into dst, which holds exactly their total length.
func planesJoin(dst []byte, planes [][]byte) {
	switch len(planes) {
	case 2:
		planesJoin2(dst, planes[0], planes[1])
	case 4:
		planesJoin4(dst, (*[4][]byte)(planes))
	default:
		panic("gdswriter: planesJoin needs 2 or 4 planes")
	}
}

// The split/join kernels move 8 bytes per plane per step with shifts and
// masks, then finish the remainder bytewise.

const (
	codecMaskBytes  = 0x00FF00FF00FF00FF
	codecMaskWords  = 0x0000FFFF0000FFFF
	codecMaskSpaced = 0x000000FF000000FF
)

// planesEvenBytes packs bytes 0, 2, 4, 6 of v into the low 32 bits.
func planesEvenBytes(v uint64) uint64 {
	v &= codecMaskBytes
	v = (v | v>>8) & codecMaskWords
	return (v | v>>16) & 0xFFFFFFFF
}

// planesSpreadBytes inverts planesEvenBytes: byte i of the low 32 bits goes to byte 2i.
func planesSpreadBytes(v uint64) uint64 {
	v &= 0xFFFFFFFF
	v = (v | v<<16) & codecMaskWords
	return (v | v<<8) & codecMaskBytes
}

func planesSplit2(p0, p1, src []byte) {
	m := len(p0)
	src = src[:2*m]
	p1 = p1[:m]
	i := 0
	for ; i+8 <= m; i += 8 {
		w := src[2*i : 2*i+16]
		a := binary.LittleEndian.Uint64(w[0:8])
		b := binary.LittleEndian.Uint64(w[8:16])
		binary.LittleEndian.PutUint64(p0[i:i+8], planesEvenBytes(a)|planesEvenBytes(b)<<32)
		binary.LittleEndian.PutUint64(p1[i:i+8], planesEvenBytes(a>>8)|planesEvenBytes(b>>8)<<32)
	}
	for ; i < m; i++ {
		p0[i] = src[2*i]
		p1[i] = src[2*i+1]
	}
}

func planesJoin2(dst, p0, p1 []byte) {
	m := len(p0)
	dst = dst[:2*m]
	p1 = p1[:m]
	i := 0
	for ; i+8 <= m; i += 8 {
		a := binary.LittleEndian.Uint64(p0[i : i+8])
		b := binary.LittleEndian.Uint64(p1[i : i+8])
		w := dst[2*i : 2*i+16]
		binary.LittleEndian.PutUint64(w[0:8], planesSpreadBytes(a)|planesSpreadBytes(b)<<8)
		binary.LittleEndian.PutUint64(w[8:16], planesSpreadBytes(a>>32)|planesSpreadBytes(b>>32)<<8)
	}
	for ; i < m; i++ {
		dst[2*i] = p0[i]
		dst[2*i+1] = p1[i]
	}
}

// planesPairBytes packs bytes 0 and 4 of v into the low 16 bits.
func planesPairBytes(v uint64) uint64 {
	v &= codecMaskSpaced
	return (v | v>>24) & 0xFFFF
}

// planesUnpairBytes inverts planesPairBytes.
func planesUnpairBytes(v uint64) uint64 {
	v &= 0xFFFF
	return (v | v<<24) & codecMaskSpaced
}

func planesSplit4(planes *[4][]byte, src []byte) {
	m := len(planes[0])
	src = src[:4*m]
	p0, p1, p2, p3 := planes[0][:m], planes[1][:m], planes[2][:m], planes[3][:m]
	i := 0
	for ; i+8 <= m; i += 8 {
		w := src[4*i : 4*i+32]
		a := binary.LittleEndian.Uint64(w[0:8])
		b := binary.LittleEndian.Uint64(w[8:16])
		c := binary.LittleEndian.Uint64(w[16:24])
		d := binary.LittleEndian.Uint64(w[24:32])
		binary.LittleEndian.PutUint64(p0[i:i+8], planesPairBytes(a)|planesPairBytes(b)<<16|planesPairBytes(c)<<32|planesPairBytes(d)<<48)
		binary.LittleEndian.PutUint64(p1[i:i+8], planesPairBytes(a>>8)|planesPairBytes(b>>8)<<16|planesPairBytes(c>>8)<<32|planesPairBytes(d>>8)<<48)
		binary.LittleEndian.PutUint64(p2[i:i+8], planesPairBytes(a>>16)|planesPairBytes(b>>16)<<16|planesPairBytes(c>>16)<<32|planesPairBytes(d>>16)<<48)
		binary.LittleEndian.PutUint64(p3[i:i+8], planesPairBytes(a>>24)|planesPairBytes(b>>24)<<16|planesPairBytes(c>>24)<<32|planesPairBytes(d>>24)<<48)
	}
	for ; i < m; i++ {
		p0[i] = src[4*i]
		p1[i] = src[4*i+1]
		p2[i] = src[4*i+2]
		p3[i] = src[4*i+3]
	}
}

func planesJoin4(dst []byte, planes *[4][]byte) {
	m := len(planes[0])
	dst = dst[:4*m]
	p0, p1, p2, p3 := planes[0][:m], planes[1][:m], planes[2][:m], planes[3][:m]
	i := 0
	for ; i+8 <= m; i += 8 {
		a := binary.LittleEndian.Uint64(p0[i : i+8])
		b := binary.LittleEndian.Uint64(p1[i : i+8])
		c := binary.LittleEndian.Uint64(p2[i : i+8])
		d := binary.LittleEndian.Uint64(p3[i : i+8])
		w := dst[4*i : 4*i+32]
		binary.LittleEndian.PutUint64(w[0:8], planesUnpairBytes(a)|planesUnpairBytes(b)<<8|planesUnpairBytes(c)<<16|planesUnpairBytes(d)<<24)
		binary.LittleEndian.PutUint64(w[8:16], planesUnpairBytes(a>>16)|planesUnpairBytes(b>>16)<<8|planesUnpairBytes(c>>16)<<16|planesUnpairBytes(d>>16)<<24)
		binary.LittleEndian.PutUint64(w[16:24], planesUnpairBytes(a>>32)|planesUnpairBytes(b>>32)<<8|planesUnpairBytes(c>>32)<<16|planesUnpairBytes(d>>32)<<24)
		binary.LittleEndian.PutUint64(w[24:32], planesUnpairBytes(a>>48)|planesUnpairBytes(b>>48)<<8|planesUnpairBytes(c>>48)<<16|planesUnpairBytes(d>>48)<<24)
	}
	for ; i < m; i++ {
		dst[4*i] = p0[i]
		dst[4*i+1] = p1[i]
		dst[4*i+2] = p2[i]
		dst[4*i+3] = p3[i]
	}
}
