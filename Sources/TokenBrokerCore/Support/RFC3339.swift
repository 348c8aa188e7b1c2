/// Formats instants as RFC 3339 timestamps in UTC, such as `2026-11-29T23:59:07Z`.
///
/// Written out by hand (Howard Hinnant's days-to-civil algorithm) so that it needs neither
/// ICU nor a locale, and gives the same answer everywhere.
public enum RFC3339 {
    /// The instants RFC 3339 can write, in whole seconds since 1970: `0000-01-01T00:00:00Z`
    /// to `9999-12-31T23:59:59Z`.
    public static let writableSeconds: ClosedRange<Int64> = -62_167_219_200...253_402_300_799

    /// The instant, to the second (rounded down).
    ///
    /// An instant RFC 3339 cannot write (before year 0, after year 9999, or not finite: an
    /// issuer's `exp` of `1e300`, say) reads as the nearest end of `writableSeconds` (NaN as the
    /// first), rather than stopping the process; tokens the broker serves never come near either end.
    public static func string(from date: WallTime) -> String {
        let bounds = writableSeconds
        let seconds =
            Int64(rounding: date.timeIntervalSince1970, .down).map {
                min(max($0, bounds.lowerBound), bounds.upperBound)
            }
            ?? (date.timeIntervalSince1970 > 0 ? bounds.upperBound : bounds.lowerBound)
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = seconds - days * 86_400
        let (year, month, day) = civil(fromDays: days)
        func two(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let hour = secondOfDay / 3600
        let minute = (secondOfDay % 3600) / 60
        let second = secondOfDay % 60
        let yearText = String(year)
        let paddedYear = String(repeating: "0", count: max(0, 4 - yearText.count)) + yearText
        return "\(paddedYear)-\(two(month))-\(two(day))T\(two(hour)):\(two(minute)):\(two(second))Z"
    }

    /// Days since 1970-01-01 for a year, month and day of the proleptic Gregorian calendar.
    static func days(fromCivil year: Int64, _ month: Int64, _ day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// Year, month and day of the proleptic Gregorian calendar for days since 1970-01-01.
    static func civil(fromDays days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
