package controlloop

// Exported for the external tests of claiming ahead.
const (
	MaxAheadDepth = maxAheadDepth
	StaleAfterMin = staleAfterMin
)
