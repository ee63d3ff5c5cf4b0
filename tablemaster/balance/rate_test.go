package balance

import "time"

func testTime(sec int) time.Time { return time.Unix(1_700_000_000+int64(sec), 0) }
