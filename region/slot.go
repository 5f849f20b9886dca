package region

import "strconv"

// Redis Cluster slot of a key's hash tag: CRC16/XMODEM mod 16384.
const numSlots = 16384

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func slotOf(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^tag[i]]
	}
	return int(crc) % numSlots
}

// slotTags[i] is a short string whose slot is i. The reap index of slot i
// is keyed with it, so an index always lives in its rooms' slot and a
// script can update both atomically.
var slotTags = func() (t [numSlots]string) {
	left := numSlots
	for i := 0; left > 0; i++ {
		s := strconv.FormatInt(int64(i), 36)
		if n := slotOf(s); t[n] == "" {
			t[n] = s
			left--
		}
	}
	return t
}()
