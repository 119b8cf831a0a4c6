"""What holds a version or an object: pins, leases and publisher leases (:mod:`.pins`), the
references a version makes (:mod:`.refs`) and the retention rules over them
(:mod:`.retention`).  Garbage collection keeps what these hold; fence hits and readers
consult them."""
