package gdswriter

import (
	"bytes"
	"testing"
)

// codecFuzzMaxRaw bounds rawLen in FuzzDecode.
const codecFuzzMaxRaw = 1 << 20

var codecFuzzCodecs = []Codec{CodecRaw, CodecZstd, CodecS2, CodecPlanes2, CodecPlanes4}

// FuzzDecode feeds arbitrary stored bytes to Decode. It must not panic,
// and a successful decode must have exactly rawLen bytes. The seed corpus
// in testdata/fuzz/FuzzDecode holds valid chunks of every codec.
func FuzzDecode(f *testing.F) {
	for i, kind := range codecTestKinds {
		raw := kind.gen(2000+i*333, uint64(i))
		for _, m := range codecTestMethods {
			stored, codec := NewEncoder(m, 0).Encode(raw)
			f.Add(bytes.Clone(stored), string(codec), uint32(len(raw)))
		}
	}
	// Planes with several huff0 blocks each, and a tail.
	for _, raw := range [][]byte{codecTestBF16(300<<10+1, 20, 0.02), codecTestMixed(300<<10, 21)} {
		stored, codec := NewEncoder(MethodAuto, 2).Encode(raw)
		f.Add(bytes.Clone(stored), string(codec), uint32(len(raw)))
	}
	dec := NewDecoder()
	f.Fuzz(func(t *testing.T, stored []byte, codec string, rawLen uint32) {
		n := int(rawLen % (codecFuzzMaxRaw + 1))
		out, err := dec.Decode(nil, stored, Codec(codec), n)
		if err != nil {
			return
		}
		if len(out) != n {
			t.Fatalf("Decode(%q, %d bytes) returned %d bytes, want %d", codec, len(stored), len(out), n)
		}
		// A second decode, into a reused dst, must agree.
		dst := make([]byte, n+7)
		again, err := dec.Decode(dst[:0], stored, Codec(codec), n)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("second Decode disagrees: %v", err)
		}
	})
}

// FuzzRoundTrip encodes arbitrary data with every method and checks that
// it decodes back. rep repeats the data (with a changing byte) to reach
// chunk sizes where compression kicks in.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("hello, world"), uint8(3), uint8(0), uint16(100))
	f.Add(codecTestBF16(512, 1, 0.02), uint8(3), uint8(2), uint16(1))
	f.Add(codecTestBF16(4096, 2, 0.02), uint8(3), uint8(0), uint16(20))
	f.Add(codecTestFP32(1024, 3, 1), uint8(3), uint8(4), uint16(3))
	f.Add(make([]byte, 300), uint8(1), uint8(0), uint16(7))
	f.Add(codecTestText(700, 4), uint8(2), uint8(0), uint16(2))
	dec := NewDecoder()
	encs := map[[2]int]*Encoder{}
	f.Fuzz(func(t *testing.T, data []byte, method, elem uint8, rep uint16) {
		m := codecTestMethods[int(method)%len(codecTestMethods)]
		es := []int{0, 2, 4, 1}[elem%4]
		key := [2]int{int(method) % len(codecTestMethods), es}
		enc := encs[key]
		if enc == nil {
			enc = NewEncoder(m, es)
			encs[key] = enc
		}
		raw := data
		if k := int(rep % 512); k > 1 && len(data) > 0 {
			raw = make([]byte, 0, k*len(data))
			for i := range k {
				raw = append(raw, data...)
				raw[len(raw)-1] ^= byte(i)
			}
		}
		codecTestRoundTrip(t, enc, dec, raw)
	})
}
