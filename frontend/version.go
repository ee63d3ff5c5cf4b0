package frontend

import (
	"net/http"
	"strconv"
)

// versions are the x-ms-version values the service knows, newest first
// (Learn: "Versioning for Azure Storage", as of 2026-06; the same list as
// Azurite 3.37's ValidAPIVersions). The service refuses any other value,
// malformed or merely unknown, with 400 InvalidHeaderValue; so does the
// gateway. A version Azure publishes later is added here: until then an
// SDK that sends it is refused, as an emulator without it would be.
var versions = map[string]bool{
	"2026-06-06": true, "2026-04-06": true, "2026-02-06": true, "2025-11-05": true,
	"2025-07-05": true, "2025-05-05": true, "2025-01-05": true, "2024-11-04": true,
	"2024-08-04": true, "2024-05-04": true, "2024-02-04": true, "2023-11-03": true,
	"2023-08-03": true, "2023-01-03": true, "2022-11-02": true, "2021-12-02": true,
	"2021-10-04": true, "2021-08-06": true, "2021-06-08": true, "2021-04-10": true,
	"2021-02-12": true, "2020-12-06": true, "2020-10-02": true, "2020-08-04": true,
	"2020-06-12": true, "2020-04-08": true, "2020-02-10": true, "2019-12-12": true,
	"2019-10-10": true, "2019-07-07": true, "2019-02-02": true, "2018-11-09": true,
	"2018-03-28": true, "2017-11-09": true, "2017-07-29": true, "2017-04-17": true,
	"2016-05-31": true, "2015-12-11": true, "2015-07-08": true, "2015-04-05": true,
	"2015-02-21": true, "2014-02-14": true, "2013-08-15": true, "2012-02-12": true,
	"2011-08-18": true, "2009-09-19": true, "2009-07-17": true, "2009-04-14": true,
}

// errVersion is the answer to an x-ms-version the service does not know.
func errVersion(v string) *svcError {
	return &svcError{status: http.StatusBadRequest, code: "InvalidHeaderValue",
		msg: "The value for one of the HTTP headers is not in the correct format: x-ms-version " + quoteHeader(v) + " is not a version of the service."}
}

// quoteHeader quotes a header value for a message, at most 64 bytes of it.
func quoteHeader(v string) string {
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return strconv.Quote(v)
}
