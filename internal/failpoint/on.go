//go:build stasis_failpoints

package failpoint

import (
	"os"
	"slices"
	"strings"
)

// Active says whether point is listed in $STASIS_FAILPOINTS.
func Active(point string) bool {
	return slices.Contains(strings.Split(os.Getenv("STASIS_FAILPOINTS"), ","), point)
}
