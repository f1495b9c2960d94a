package bmdb

import bmdbapi "github.com/shepherd-fleet/shepherd/bmdb"

// Process names one control loop in the BMDB: the public package's type,
// which the machinery uses as it is.
type Process = bmdbapi.Process
