// Package failpoint lets tests make stasis fail at named points, as bbolt's
// failpoints do: the points are compiled in only with the build tag
// stasis_failpoints (the tests' binaries), where $STASIS_FAILPOINTS lists
// the active ones, separated by commas. In stasis as built by `make`,
// Active is false and the points cost nothing.
package failpoint

// Names of the points.
const (
	// FillWrongPage makes a filled restore write one wrong byte into the
	// first part of the memory it fills.
	FillWrongPage = "fill-wrong-page"
)
