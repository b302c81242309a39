package agentapi

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseLSN converts a PostgreSQL WAL position in its text form "X/Y" (two groups of 1 to 8
// hexadecimal digits, either case, e.g. "16/B374D848") to a byte position: X is the high
// 32 bits, Y the low 32 bits. It accepts exactly what PostgreSQL's pg_lsn input accepts,
// except surrounding whitespace.
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("invalid LSN %q: want X/Y in hexadecimal", s)
	}
	h, err := parseLSNHalf(hi)
	if err != nil {
		return 0, fmt.Errorf("invalid LSN %q: %w", s, err)
	}
	l, err := parseLSNHalf(lo)
	if err != nil {
		return 0, fmt.Errorf("invalid LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// parseLSNHalf parses one side of "X/Y": 1 to 8 hexadecimal digits and nothing else.
func parseLSNHalf(s string) (uint64, error) {
	if len(s) == 0 || len(s) > 8 {
		return 0, fmt.Errorf("%q is not 1 to 8 hexadecimal digits", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return 0, fmt.Errorf("%q is not 1 to 8 hexadecimal digits", s)
		}
	}
	// Cannot fail: at most 8 hexadecimal digits fit in 32 bits.
	return strconv.ParseUint(s, 16, 32)
}

// FormatLSN is the inverse of ParseLSN, in PostgreSQL's own output form: upper case,
// no leading zeros ("16/B374D848", "0/0").
func FormatLSN(lsn uint64) string {
	return strings.ToUpper(strconv.FormatUint(lsn>>32, 16) + "/" + strconv.FormatUint(lsn&0xFFFFFFFF, 16))
}
